-- Versions of a workflow definition: a run goes on only with the version it started with (RunStarted's
-- `version`), so a worker claims a node only if it has that version, and leaves it to one that has.

-- Each queue row carries its run's version. A row inserted without one (every insert: at a start, at a
-- node's end, after a retry or a wait) takes it from the run's RunStarted event, the first of the run's
-- stream, written earlier in the same transaction or before: one probe of the stream's unique index. So
-- no statement that queues nodes needs to know about versions, and the row always agrees with the log.
ALTER TABLE ledgerflow.workflow_queue ADD COLUMN version text;

CREATE FUNCTION ledgerflow.wf_run_version(p_tenant text, p_run_id uuid) RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT coalesce(
        (SELECT e.data ->> 'version' FROM ledgerflow.events e
          WHERE e.tenant = p_tenant AND e.stream_id = 'wf-' || p_run_id::text AND e.stream_version = 1
            AND e.event_type = 'wf.RunStarted'),
        '1')
$$;

UPDATE ledgerflow.workflow_queue SET version = ledgerflow.wf_run_version(tenant, run_id);
ALTER TABLE ledgerflow.workflow_queue ALTER COLUMN version SET NOT NULL;

CREATE FUNCTION ledgerflow.wf_queue_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := ledgerflow.wf_run_version(NEW.tenant, NEW.run_id);
    RETURN NEW;
END
$$;

CREATE TRIGGER workflow_queue_version BEFORE INSERT ON ledgerflow.workflow_queue
   FOR EACH ROW WHEN (NEW.version IS NULL) EXECUTE FUNCTION ledgerflow.wf_queue_version();

-- The claim walks one (workflow, version)'s ready rows in ready order: a worker never steps over the rows
-- of versions it lacks, however many wait for a worker that has them.
CREATE INDEX workflow_queue_ready_by_version ON ledgerflow.workflow_queue (workflow, version, ready_at)
 WHERE status = 'ready';
DROP INDEX ledgerflow.workflow_queue_ready_by_workflow;

-- Which versions each live worker process has (written when it starts; rows of processes whose presence
-- is gone are cleared then too), so that `ledgerflow doctor` can name runs that wait for a version no
-- live worker has.
CREATE TABLE ledgerflow.workflow_worker_versions (
    instance  text        NOT NULL,
    workflow  text        NOT NULL,
    version   text        NOT NULL,
    since     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (instance, workflow, version)
);
