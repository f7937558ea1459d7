-- Projections: durable cursors, leases between worker processes, runs and failures.

-- One row per projection: where it stands in the log's resume order (transaction id, position).
-- A batch's table changes and its cursor advance commit together, with a compare-and-set on the cursor.
CREATE TABLE ledgerflow.projection_cursors (
    projection      text        PRIMARY KEY,
    cursor_tx       bigint      NOT NULL DEFAULT 0,
    cursor_position bigint      NOT NULL DEFAULT 0,
    version         integer     NOT NULL,
    events_applied  bigint      NOT NULL DEFAULT 0,
    updated_at      timestamptz NOT NULL DEFAULT now()
);

-- Leases divide projections between workers. They live in rows, not in connection-bound advisory locks,
-- so they survive connection poolers; the epoch fences a worker that lost its lease.
CREATE TABLE ledgerflow.projection_leases (
    projection    text        PRIMARY KEY,
    owner         text        NOT NULL,
    epoch         bigint      NOT NULL,
    acquired_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    expires_at    timestamptz NOT NULL
);

CREATE TABLE ledgerflow.projection_runs (
    id                bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection        text        NOT NULL,
    kind              text        NOT NULL CHECK (kind IN ('catch_up', 'replay', 'rebuild', 'verify')),
    trigger           text        NOT NULL,
    actor             text        NOT NULL,
    owner             text        NOT NULL,
    status            text        NOT NULL DEFAULT 'running'
                      CHECK (status IN ('running', 'completed', 'failed', 'abandoned', 'stopped')),
    start_tx          bigint      NOT NULL,
    start_position    bigint      NOT NULL,
    end_tx            bigint,
    end_position      bigint,
    target_tx         bigint,
    target_position   bigint,
    events_processed  bigint      NOT NULL DEFAULT 0,
    started_at        timestamptz NOT NULL DEFAULT now(),
    heartbeat_at      timestamptz NOT NULL DEFAULT now(),
    ended_at          timestamptz,
    digest            text,
    error             text
);
CREATE INDEX projection_runs_by_projection ON ledgerflow.projection_runs (projection, id DESC);
CREATE INDEX projection_runs_running ON ledgerflow.projection_runs (heartbeat_at) WHERE status = 'running';
-- At most one rebuild or replay of a projection at a time.
CREATE UNIQUE INDEX projection_runs_one_rebuild ON ledgerflow.projection_runs (projection)
    WHERE status = 'running' AND kind IN ('rebuild', 'replay');

-- Events a projection could not apply. Nothing is skipped silently: a skip is recorded here too.
CREATE TABLE ledgerflow.projection_failures (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    projection      text        NOT NULL,
    event_position  bigint      NOT NULL,
    event_tx        bigint      NOT NULL,
    event_id        uuid        NOT NULL,
    tenant          text        NOT NULL,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_type      text        NOT NULL,
    policy          text        NOT NULL CHECK (policy IN ('block', 'park')),
    status          text        NOT NULL DEFAULT 'open'
                    CHECK (status IN ('open', 'retry_requested', 'skip_requested', 'resolved', 'skipped')),
    error_class     text        NOT NULL,
    error_message   text        NOT NULL,
    attempts        integer     NOT NULL,
    first_seen      timestamptz NOT NULL DEFAULT now(),
    last_seen       timestamptz NOT NULL DEFAULT now(),
    resolved_at     timestamptz,
    resolved_by     text,
    UNIQUE (projection, event_position)
);
CREATE INDEX projection_failures_open ON ledgerflow.projection_failures (projection)
    WHERE status IN ('open', 'retry_requested', 'skip_requested');
