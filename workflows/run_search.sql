-- Searching runs (workflows.run_search): a search is one SELECT put together from these parts, the
-- source (the run table, or the tag rows of its first tag joined to the run table), the conditions of
-- the filters it has, and its page. Every search orders by (created_at, run_id), newest first, and pages
-- by keyset on that pair (never OFFSET): a page deep in the results costs what the first one does.

-- name: columns
SELECT r.run_id, r.workflow, r.workflow_version, r.key, r.status, r.current_node, r.nodes_total,
       r.nodes_done, r.error, r.cancel_requested, r.created_at, r.updated_at, r.finished_at, r.tags,
       r.parent_run_id, r.triggered_by->>'event_id' AS triggered_by,
       (SELECT string_agg(coalesce('signal ' || n.waiting_for, 'timer'), ', ' ORDER BY n.position)
          FROM ledgerflow.workflow_nodes n
         WHERE n.run_id = r.run_id AND n.status = 'waiting') AS waiting

-- name: from_runs
FROM ledgerflow.workflow_runs r
WHERE r.tenant = %(tenant)s

-- name: from_tag
-- The first tag drives the search: its rows are in page order in workflow_run_tags_by_value.
FROM ledgerflow.workflow_run_tags t
JOIN ledgerflow.workflow_runs r ON r.run_id = t.run_id
WHERE t.tenant = %(tenant)s AND t.key = %(tag_key)s AND t.value = %(tag_value)s AND r.tenant = %(tenant)s

-- name: page_runs
AND (r.created_at, r.run_id) < (%(after_at)s, %(after_run)s)

-- name: page_tag
AND (t.created_at, t.run_id) < (%(after_at)s, %(after_run)s)

-- name: order_runs
ORDER BY r.created_at DESC, r.run_id DESC LIMIT %(limit)s

-- name: order_tag
ORDER BY t.created_at DESC, t.run_id DESC LIMIT %(limit)s

-- name: workflow
AND r.workflow = %(workflow)s

-- name: version
AND r.workflow_version = %(version)s

-- name: statuses
AND r.status = ANY(%(statuses)s::text[])

-- name: started_after
AND r.created_at >= %(started_after)s

-- name: started_before
AND r.created_at < %(started_before)s

-- name: ended_after
AND r.finished_at >= %(ended_after)s

-- name: ended_before
AND r.finished_at < %(ended_before)s

-- name: parent
AND r.parent_run_id = %(parent)s

-- name: triggered_by
AND r.triggered_by IS NOT NULL AND r.triggered_by->>'event_id' = %(triggered_by)s

-- name: more_tags
-- The other tags, all of them: each (key, value) pair is one row of the run's at most.
AND (SELECT count(*)
       FROM ledgerflow.workflow_run_tags m
       JOIN unnest(%(more_keys)s::text[], %(more_values)s::text[]) AS w(key, value)
         ON m.key = w.key AND m.value = w.value
      WHERE m.run_id = r.run_id) = %(more_count)s
