-- ledgerflow.wf_run_version, which gives each queue row inserted without a version its run's version
-- (migration 0016), in PL/pgSQL. As a SQL function it was planned again in every transaction that
-- called it (a SQL function keeps its plan only as long as its caller's expression state, which PL/pgSQL
-- renews per transaction), and planning a query of the partitioned log costs more with every partition:
-- 0.5 ms of each node's end, once per successor made ready, measured with track_functions. PL/pgSQL
-- keeps the plan for the session; the query and the answer are the same.

CREATE OR REPLACE FUNCTION ledgerflow.wf_run_version(p_tenant text, p_run_id uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN coalesce(
        (SELECT e.data ->> 'version' FROM ledgerflow.events e
          WHERE e.tenant = p_tenant AND e.stream_id = 'wf-' || p_run_id::text AND e.stream_version = 1
            AND e.event_type = 'wf.RunStarted'),
        '1');
END
$$;
