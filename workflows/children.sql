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
