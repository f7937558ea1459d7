-- Statements of workflows.children. `{workflow_children}` / `{table}` is the projection's table: its live
-- copy, or the shadow copy while it is rebuilt (see projector.projection.ApplyContext).

-- name: create_children
-- One row per child run: its parent and its parent-close policy, from the child's RunStarted.
CREATE TABLE {table} (
    tenant          text NOT NULL,
    parent_run_id   uuid NOT NULL,
    child_run_id    uuid NOT NULL,
    parent_close    text NOT NULL,
    PRIMARY KEY (tenant, parent_run_id, child_run_id)
)

-- name: link
-- A replay applies a start again: the row is there already.
INSERT INTO {workflow_children} (tenant, parent_run_id, child_run_id, parent_close)
VALUES (%s, %s, %s, %s)
ON CONFLICT (tenant, parent_run_id, child_run_id) DO NOTHING

-- name: children_of
-- Bounded by what one run's nodes start (each child is a memoized start of a node).
SELECT child_run_id, parent_close FROM {workflow_children}
 WHERE tenant = %s AND parent_run_id = %s
 ORDER BY child_run_id

-- name: unlink
-- A run retention released leaves the links it has, as a parent and as a child (it has ended: nothing
-- follows it any more).
DELETE FROM {workflow_children}
 WHERE tenant = %s AND (parent_run_id = %s OR child_run_id = %s)

-- name: links_of_restored
-- A restored run's links, from its own stream: its start's parent (the run as a child) and the children
-- its nodes started with a policy (the run as a parent), as they were linked the first time.
SELECT (data -> 'parent' ->> 'run_id')::uuid, run_id_text::uuid,
       coalesce(data -> 'parent' ->> 'parent_close', 'cancel')
  FROM (SELECT data, %(run_id)s::text AS run_id_text
          FROM ledgerflow.events
         WHERE tenant = %(tenant)s AND stream_id = %(stream)s AND stream_version = 1
           AND data ? 'parent') s
UNION ALL
SELECT %(run_id)s::uuid, (data ->> 'child_run_id')::uuid, data ->> 'parent_close'
  FROM ledgerflow.events
 WHERE tenant = %(tenant)s AND stream_id = %(stream)s AND event_type = 'wf.ChildStarted'
   AND data ->> 'parent_close' IS NOT NULL
