"""`ledgerflow serve`: one process with the HTTP API and console, projector workers and workflow workers.

Roles can be chosen (`--api`, `--projector`, `--worker`), so the API, projectors and workers can be scaled
apart; with no role flag, all three run. SIGTERM (or Ctrl-C) stops the API, lets running nodes hand
themselves back, releases every lease and exits.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import structlog

from ops.services import Services, open_services
from ops.settings import Settings
from ops.telemetry import configure_telemetry
from projector import ProjectorWorker
from projector import WorkerSettings as ProjectorSettings
from workflows import WorkflowWorker

log = structlog.get_logger(__name__)

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
    services = open_services(
        settings.model_copy(update={"idle_in_transaction_timeout": idle}), name="ledgerflow-serve"
    )
    stoppers: list[Callable[[], None]] = []
    threads: list[threading.Thread] = []
    if projector:
        p = ProjectorWorker(
            services.store,
            services.projections,
            ProjectorSettings(
                lease_ttl=settings.projector_lease_ttl,
                heartbeat_interval=settings.projector_heartbeat_interval,
                batch_size=settings.projector_batch_size,
                abandoned_after=settings.abandoned_after,
            ),
        )
        p.prepare()
        threads.append(threading.Thread(target=p.run, name="projector", daemon=True))
        stoppers.append(p.stop)
    if worker:
        from ops.cli_workflows import worker_settings

        w = WorkflowWorker(
            services.engine, services.registry, worker_settings(settings), name=settings.worker_name
        )
        threads.append(threading.Thread(target=w.run, name="workflow-worker", daemon=True))
        stoppers.append(w.stop)
    for t in threads:
        t.start()
    try:
        if api:
            _run_api(services, host, port)
        else:
            _wait_for_signal()
    finally:
        for stop in stoppers:
            stop()
        for t in threads:
            t.join(timeout=settings.workflow_lease_ttl + 5)
        services.close()
        log.info("serve_stopped")


def _run_api(services: Services, host: str, port: int) -> None:
    import uvicorn

    from ops.api.app import create_app
    from ops.metrics_endpoint import add_metrics_route

    app = create_app(services)
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
    uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_config=None, access_log=False)).run()


def _bootstrap_token(services: Services) -> None:
    """On a fresh install, make one admin token so the console can be opened at all; show it once."""
    from ops.auth import create_token, list_tokens

    if list_tokens(services.store):
        return
    token_id, secret = create_token(services.store, tenant="default", scopes=["admin"], name="bootstrap")
    print(
        "\n  First start: created an admin API token for tenant 'default' (shown only now):\n\n"
        f"    {secret}\n\n"
        "  Use it in the console and as `Authorization: Bearer <token>`; revoke it with "
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
