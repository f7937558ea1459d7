-- Workflows: the scheduler's queue of runnable and running nodes, with leases and fencing tokens.
-- The queue is operational state beside the log (like leases): every change to it is made in the same
-- transaction as the run-stream event that causes it, so it can always be derived again from the log.

CREATE SEQUENCE ledgerflow.workflow_fencing_tokens;

CREATE TABLE ledgerflow.workflow_queue (
    run_id            uuid        NOT NULL,
    node              text        NOT NULL,
    tenant            text        NOT NULL,
    workflow          text        NOT NULL,
    -- ready: waiting for a worker (from ready_at on); claimed: a worker holds its lease; parked:
    -- crashed too often, waits for an operator.
    status            text        NOT NULL DEFAULT 'ready' CHECK (status IN ('ready', 'claimed', 'parked')),
    ready_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    attempt           integer     NOT NULL DEFAULT 0,
    crashes           integer     NOT NULL DEFAULT 0,
    max_crashes       integer     NOT NULL,
    progress_deadline float8,
    on_stuck          text        NOT NULL DEFAULT 'retry' CHECK (on_stuck IN ('retry', 'fail')),
    -- The current claim: its fencing token changes with every claim, so writes of an earlier holder fail.
    token             bigint,
    worker_name       text,
    worker_instance   text,
    claimed_at        timestamptz,
    heartbeat_at      timestamptz,
    lease_expires_at  timestamptz,
    progress_at       timestamptz,
    cancel_requested  boolean     NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, node)
);
CREATE INDEX workflow_queue_ready ON ledgerflow.workflow_queue (ready_at) WHERE status = 'ready';
CREATE INDEX workflow_queue_leases ON ledgerflow.workflow_queue (lease_expires_at) WHERE status = 'claimed';
CREATE INDEX workflow_queue_instance ON ledgerflow.workflow_queue (worker_instance) WHERE status = 'claimed';

-- Fencing: every write a node makes runs this first, in the same transaction. It fails unless the
-- caller's claim is still the current one and its lease has not lapsed; the row lock it takes keeps a
-- reclaimer waiting until the write commits. LF004: lease lost; LF005: the run is being cancelled.
CREATE FUNCTION ledgerflow.wf_fence(p_run_id uuid, p_node text, p_token bigint, p_check_cancel boolean)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    v_cancel boolean;
BEGIN
    UPDATE ledgerflow.workflow_queue q SET progress_at = clock_timestamp()
     WHERE q.run_id = p_run_id AND q.node = p_node AND q.token = p_token AND q.status = 'claimed'
       AND q.lease_expires_at > clock_timestamp()
    RETURNING q.cancel_requested INTO v_cancel;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'lease lost' USING ERRCODE = 'LF004',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node, 'token', p_token)::text;
    END IF;
    IF p_check_cancel AND v_cancel THEN
        RAISE EXCEPTION 'run cancelled' USING ERRCODE = 'LF005',
            DETAIL = json_build_object('run_id', p_run_id, 'node', p_node)::text;
    END IF;
END
$$;

-- Recovery sweeps, recorded so operators see what recovery found and did.
CREATE TABLE ledgerflow.workflow_recoveries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker       text        NOT NULL,
    trigger      text        NOT NULL,
    started_at   timestamptz NOT NULL,
    duration_ms  float8      NOT NULL,
    found        integer     NOT NULL,
    reclaimed    integer     NOT NULL,
    parked       integer     NOT NULL,
    stuck        integer     NOT NULL,
    failed       integer     NOT NULL
);
