"""`ledgerflow serve`: one process with the HTTP API and console, projector workers and workflow workers.

Roles can be chosen (`--api`, `--projector`, `--worker`), so the API, projectors and workers can be scaled
apart; with no role flag, all three run. SIGTERM (or Ctrl-C) stops the API, lets running nodes hand
themselves back, releases every lease and exits.

The process waits for the database at start-up. Each worker role runs in its own thread, waits out
database outages itself, and is restarted with back-off if it dies for another reason; `/api/healthz`
and `/api/readyz` report every role's state (`ops.roles`).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import structlog

from eventstore.spi import is_unavailable
from ops.budget import budget, log_connection_budget
from ops.process_exit import exit_past_stuck_threads
from ops.roles import Role
from ops.services import Services, StopSignal, open_services
from ops.settings import Settings
from ops.telemetry import configure_telemetry
from projector import ProjectorWorker
from projector import WorkerSettings as ProjectorSettings
from workflows import Engine, RetentionSettings, RetentionWorker, WorkflowWorker

log = structlog.get_logger(__name__)
_GRACE_SECONDS = 10

#: Workflows served when none are configured, so a fresh install has something to run.
SAMPLE_WORKFLOWS = "workflows.demo:registry"


def serve(settings: Settings, *, api: bool, projector: bool, worker: bool, host: str, port: int) -> None:
    configure_telemetry()
    if not settings.workflows:
        settings = settings.model_copy(update={"workflows": SAMPLE_WORKFLOWS})
        log.info(
            "sample_workflows_loaded", workflows=SAMPLE_WORKFLOWS, hint="set LEDGERFLOW_WORKFLOWS for yours"
        )
    # Frozen processes must not hold locks past their leases (see eventstore.settings).
    idle = min(
        settings.idle_in_transaction_timeout, settings.workflow_lease_ttl, settings.projector_lease_ttl
    )
    stopping = StopSignal.install()  # while it waits for the database to start, SIGTERM stops it too
    try:
        services = open_services(
            settings.model_copy(update={"idle_in_transaction_timeout": idle}),
            name="ledgerflow-serve",
            stopping=stopping.event,
        )
    except Exception as exc:
        if stopping.event.is_set() and is_unavailable(exc):
            log.info("stopped_before_start", role="ledgerflow-serve")
            return
        raise
    if stopping.event.is_set():  # the signal came as the store opened
        services.close()
        return
    own = []
    if api:
        # The API's own: its shared listener for waiting reads, its health check and its token lookups;
        # and the store's notifier, as the API appends (a worker counts it when there is one).
        api_own = {"api_listener": 1, "health_check": 1, "token_lookups": 1}
        own.append(api_own if worker else api_own | {"notifier": 1})
    if projector:
        own.append(ProjectorWorker.dedicated_connections())
    if worker:
        from ops.cli.worker import worker_settings

        own.append(WorkflowWorker.dedicated_connections(services.registry, worker_settings(settings)))
    log_connection_budget(budget("serve", settings, *own))
    if projector:
        services.roles.append(Role("projector", lambda: _projector(services)))
    if worker:
        services.roles.append(Role("workflow-worker", lambda: _workflow_worker(services)))
        if RetentionSettings().retention_interval > 0:
            services.roles.append(Role("retention", lambda: _retention(services)))
    for role in services.roles:
        role.start()
    try:
        if api:
            _run_api(services, host, port)
        else:
            _wait_for_signal()
    finally:
        for role in services.roles:
            role.stop()
        for role in services.roles:
            role.join(timeout=settings.workflow_lease_ttl + 5)
        services.close()
        log.info("serve_stopped")
    exit_past_stuck_threads()  # a node body stuck past the grace period was handed back: do not wait on it


def _projector(services: Services) -> ProjectorWorker:
    settings = services.settings
    p = ProjectorWorker(
        services.store,
        services.projections,
        ProjectorSettings(
            lease_ttl=settings.projector_lease_ttl,
            heartbeat_interval=settings.projector_heartbeat_interval,
            batch_size=settings.projector_batch_size,
            abandoned_after=settings.abandoned_after,
            shutdown_database_timeout=settings.shutdown_database_timeout,
        ),
    )
    p.prepare()
    return p


def _workflow_worker(services: Services) -> WorkflowWorker:
    from ops.cli.worker import worker_settings

    settings = services.settings
    # An engine without quotas: triggers, schedules and the starts of nodes are the server's own work.
    return WorkflowWorker(
        Engine(services.store, services.registry),
        services.registry,
        worker_settings(settings),
        name=settings.worker_name,
        quotas=services.quotas,  # a debounced burst over its tenant's quota waits
    )


def _retention(services: Services) -> RetentionWorker:
    # Releases are the server's own work: an engine without quotas, as the workflow worker's.
    return RetentionWorker(Engine(services.store, services.registry))


def _run_api(services: Services, host: str, port: int) -> None:
    import uvicorn

    from ops.api.app import create_app
    from ops.api.settings import ApiSettings
    from ops.metrics_endpoint import add_metrics_route

    settings = ApiSettings()
    app = create_app(services, settings=settings)
    add_metrics_route(app)
    _bootstrap_token(services)
    log.info(
        "api_listening",
        url=f"http://{host}:{port}",
        console=f"http://{host}:{port}/console/",
        openapi=f"http://{host}:{port}/api/openapi.json",
    )

    # uvicorn installs its own SIGTERM/SIGINT handlers, shuts down gracefully, then restores the previous
    # handlers and raises the signal again. The previous ones are these, which only note it, so that the
    # workers' shutdown (handing nodes back, releasing leases) still runs afterwards.
    def note(signum: int, frame: FrameType | None) -> None:
        log.info("serve_stopping", signal=signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    # Requests still open after the grace period are cut: a stopping server must not wait on a slow client.
    # h11 rather than httptools: httptools keeps a request's head whatever its size (a 64 MiB header was
    # kept and answered), h11 refuses one past `max_header_bytes` (400, connection closed) having kept no
    # more than that and one read. Past `max_connections` connections and requests, new requests are 503.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=_GRACE_SECONDS,
        http="h11",
        h11_max_incomplete_event_size=settings.max_header_bytes,
        limit_concurrency=settings.max_connections,
        backlog=settings.listen_backlog,
    )
    uvicorn.Server(config).run()


def _bootstrap_token(services: Services) -> None:
    """Until a server administrator's token exists (a fresh install, or one from before token roles),
    make one for tenant 'default', so the console can be opened and projections operated; show it once."""
    from ops.auth import create_token, has_server_admin_token

    if has_server_admin_token(services.store):
        return
    token_id, secret = create_token(
        services.store, tenant="default", scopes=["admin"], name="bootstrap", server_admin=True
    )
    print(
        "\n  Created a server administrator's API token (tenant 'default'; shown only now):\n\n"
        f"    {secret}\n\n"
        "  Use it in the console and as `Authorization: Bearer <token>`; make tenant tokens with "
        "`ledgerflow tokens create --tenant <name>`; revoke this one with "
        f"`ledgerflow tokens revoke {token_id}`.\n",
        flush=True,
    )


def _wait_for_signal() -> None:
    stopped = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        stopped.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    stopped.wait()
