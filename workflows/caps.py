"""Caps on what one run may hold: its signals (count and payload size), its input, its nodes' outputs, its
steps' results and its checkpoints' outputs.

Without them one tenant could fatten a run until loading it (for a read, a cancel, or the worker that runs
its next node) costs the server hundreds of megabytes. Each cap is a setting (LEDGERFLOW_*, documented in
the README); a payload over its cap raises PayloadTooLargeError (HTTP 413), one signal too many
RunSignalLimitError (HTTP 409), and nothing is written. The outputs, step results and checkpoint
outputs a run's state holds are bounded in sum too (LEDGERFLOW_MAX_RUN_STATE_BYTES): one that would take
the state over it is refused in the same way, so the node fails with that error. The per-event cap of the log
(LEDGERFLOW_MAX_EVENT_BYTES) still applies on top: these are tighter, per kind of payload.

Sizes are counted on the JSON text the payload is written as (the same serialisation the append makes).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, PositiveInt
from pydantic_settings import BaseSettings, SettingsConfigDict

from eventstore.spi import dump_json_object
from workflows.errors import PayloadTooLargeError

KiB = 1024


class RunCaps(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERFLOW_", extra="ignore")

    #: Signals one run may receive over its life (repeats under an idempotency key count once).
    max_signals_per_run: PositiveInt = 1000
    #: The largest signal payload, in bytes of JSON.
    max_signal_bytes: PositiveInt = 64 * KiB
    #: The largest input of a run (a start's, or a refresh's), in bytes of JSON.
    max_input_bytes: PositiveInt = 256 * KiB
    #: The largest output of a node, result of a step or output of a checkpoint, in bytes of JSON.
    max_output_bytes: PositiveInt = 256 * KiB
    #: The most a run's state may hold of node outputs, step results and checkpoint outputs together, in
    #: bytes of JSON: each is capped by max_output_bytes, this bounds how many. Every load of the run (a
    #: read, a cancel, the worker that runs its next node) holds them all.
    max_run_state_bytes: PositiveInt = 16 * 1024 * KiB
    #: A load that folded at least this many events past the run's snapshot writes a new one
    #: (workflows.snapshots): a load never folds much more than this many events.
    run_snapshot_every: int = Field(default=100, ge=1, le=1_000_000)

    def check_signal(self, payload: Any) -> None:
        limit = self.max_signal_bytes
        _check("the signal's payload", {"payload": payload}, limit, "LEDGERFLOW_MAX_SIGNAL_BYTES")

    def check_input(self, value: Any) -> None:
        _check("the run's input", {"input": value}, self.max_input_bytes, "LEDGERFLOW_MAX_INPUT_BYTES")

    def check_output(self, what: str, value: Any, held: int = 0) -> None:
        """`what`: e.g. "output of node 'fetch'", "result of step 'call'"; `held`: the bytes the run's
        state holds already (`RunState.held_bytes`), which `value` would add to."""
        size = _check(what, {"value": value}, self.max_output_bytes, "LEDGERFLOW_MAX_OUTPUT_BYTES")
        if held + size > self.max_run_state_bytes:
            raise PayloadTooLargeError(
                f"the run's state with the {what}",
                held + size,
                self.max_run_state_bytes,
                "LEDGERFLOW_MAX_RUN_STATE_BYTES",
            )


# The JSON of `{"<name>":` and the closing brace are left out of the count: the payload's own size.
def _check(what: str, wrapped: dict[str, Any], limit: int, setting: str) -> int:
    text = dump_json_object(wrapped, what)
    (name,) = wrapped
    size = len(text.encode()) - len(name) - 5
    if size > limit:
        raise PayloadTooLargeError(what, size, limit, setting)
    return size
