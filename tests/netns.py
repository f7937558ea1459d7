"""Other hosts on this machine: Linux network namespaces joined to this one by a veth pair.

A `Host` is a network namespace with one link to the root namespace: its processes reach the database
only through a TCP forwarder that listens on the link's root-side address (a namespace cannot reach the
root namespace's 127.0.0.1). `cut()` drops every packet as it arrives at either end of the link (an
nftables ingress chain on each end's device, nothing else on the machine is touched): packets vanish,
nobody sends a reset, a FIN or an error, both ends retransmit with their usual back-off, connects time
out. That is a real partition, unlike a closed socket, a refused connection, or a link taken down (the
sender of a packet with no route gets a local error and retries every half second). `heal()` removes
the two chains.

Needs root, iproute2 (`ip`) and nftables (`nft`); `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from tests.acceptance.test_takeover_drill import SlowNetwork


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces and veth links need root"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install iproute2)"
    if shutil.which("nft") is None:
        return "no `nft` command (apt-get install nftables)"
    return None


def _run(argv: Sequence[str], *, check: bool = True) -> None:
    subprocess.run(argv, check=check, capture_output=True, timeout=10)


def _ip(*args: str) -> None:
    _run(["ip", *args])


@dataclass(frozen=True)
class Host:
    """A network namespace with one link to the root namespace."""

    namespace: str
    root_link: str
    inner_link: str
    #: The root side's address (where the forwarder listens) and the namespace side's.
    root_address: str
    address: str

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the namespace (`ip netns exec` keeps the process id: it execs)."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def cut(self) -> None:
        """Drop every packet on the link, both ways, as it arrives: neither end is told."""
        for inside, link in ((False, self.root_link), (True, self.inner_link)):
            chain = f"{{ type filter hook ingress device {link} priority 0; policy drop; }}"
            self._nft(inside, "add", "table", "netdev", self._table)
            self._nft(inside, "add", "chain", "netdev", self._table, "cut", chain)

    def heal(self, *, check: bool = True) -> None:
        for inside in (False, True):
            self._nft(inside, "delete", "table", "netdev", self._table, check=check)

    @property
    def _table(self) -> str:
        return f"lf_cut_{self.root_link}"

    def _nft(self, inside: bool, *args: str, check: bool = True) -> None:
        _run(self.command(["nft", *args]) if inside else ["nft", *args], check=check)


@contextmanager
def isolated_host(label: str) -> Iterator[Host]:
    """A fresh namespace and link (a random /30 in 10.200.0.0/13), removed afterwards with the link."""
    suffix = uuid.uuid4().hex[:6]
    namespace, root_link, inner_link = f"lf-{label}-{suffix}", f"lfr{suffix}", f"lfn{suffix}"
    net = random.randrange(200 << 14, 208 << 14) << 2  # 10.200.0.0 .. 10.207.255.252, as /30s
    root_address = f"10.{net >> 16 & 255}.{net >> 8 & 255}.{(net & 255) + 1}"
    address = f"10.{net >> 16 & 255}.{net >> 8 & 255}.{(net & 255) + 2}"
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", root_link, "type", "veth", "peer", "name", inner_link, "netns", namespace)
        _ip("addr", "add", f"{root_address}/30", "dev", root_link)
        _ip("link", "set", root_link, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", inner_link)
        _ip("-n", namespace, "link", "set", inner_link, "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        host = Host(namespace, root_link, inner_link, root_address, address)
        try:
            yield host
        finally:
            host.heal(check=False)  # the root side's chain lives in this namespace
    finally:
        # Removing the namespace removes its end of the link, and with it the root end.
        _run(["ip", "netns", "del", namespace], check=False)
        _run(["ip", "link", "del", root_link], check=False)


class Forwarder(SlowNetwork):
    """The slow-network drill's proxy without the delay, listening on `listen` (a link's root-side
    address) instead of 127.0.0.1."""

    def __init__(self, listen: str, host: str, port: int) -> None:
        super().__init__(host, port, delay=0.0)
        self.listen = listen

    async def _serve(self) -> None:
        server = await asyncio.start_server(self._accept, self.listen, 0)
        self.local_port = server.sockets[0].getsockname()[1]
        self._listening.set()
        await self._stop.wait()
        server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        await asyncio.gather(*(w.wait_closed() for w in self._writers), return_exceptions=True)
        await server.wait_closed()


@contextmanager
def reachable_database(host: Host, url: str) -> Iterator[str]:
    """The URL by which processes in `host` reach the database at `url`, through a forwarder."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    with Forwarder(
        host.root_address, str(info.get("host", "127.0.0.1")), int(str(info.get("port", 5432)))
    ) as fw:
        yield psycopg.conninfo.make_conninfo(url, host=host.root_address, port=str(fw.local_port))
