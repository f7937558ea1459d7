"""A pool whose server does not accept connections (down, restarting) answers a checkout within seconds,
not after its timeout: the caller's outage handling takes over at once, and an API request answers 503."""

from __future__ import annotations

import socket
import time

import psycopg_pool
import pytest

from eventstore.pooling import Pool


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nothing listens there once the socket is closed


def test_a_checkout_from_a_pool_whose_server_is_away_gives_up_within_seconds() -> None:
    pool = Pool(
        f"postgresql://nobody@127.0.0.1:{_closed_port()}/none?connect_timeout=2",
        min_size=0,
        max_size=2,
        timeout=30.0,
        reconnect_timeout=3.0,
        open=False,
    )
    pool.reclaim_idle = lambda: None  # as the store's pool has it
    pool.open(wait=False)
    try:
        began = time.monotonic()
        with pytest.raises(psycopg_pool.PoolTimeout):
            pool.getconn()
        took = time.monotonic() - began
        assert took < pool.timeout / 2, f"waited {took:.1f}s for a server that refuses connections"
    finally:
        pool.close()
