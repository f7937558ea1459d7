"""`ops.api.in_flight.RequestsInFlight` shares its cap out while several tenants are active: a tenant
alone holds the whole cap, two hold half each, and requests waiting for their tenant's share go on once it
grows again."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from ops.api.in_flight import NoPlaceAgain, RequestsInFlight


def run_apart(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run `scenario` on an event loop of its own thread. Not on this thread: after a browser test in
    the same test process, sync Playwright (a session fixture) keeps its event loop running here."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, scenario()).result(timeout=60)


def test_the_cap_is_shared_while_two_tenants_are_active() -> None:
    async def scenario() -> None:
        requests = RequestsInFlight(8, max_queued=16, max_wait=5)
        for _ in range(8):
            assert await requests.enter("a")
        assert requests.share() == 8  # alone: the whole cap
        assert await requests.enter("b")  # another tenant gets in at once...
        assert requests.share() == 4  # ...and from now on each may hold half
        more_of_a = asyncio.ensure_future(requests.enter("a"))
        await asyncio.sleep(0)
        assert not more_of_a.done()
        assert requests.queued("a") == 1
        for _ in range(4):  # back to its share: no slot was handed on meanwhile
            requests.leave("a")
        await asyncio.sleep(0)
        assert requests.of("a") == 4
        assert not more_of_a.done()
        requests.leave("b")  # alone again: the waiting request goes on
        assert await asyncio.wait_for(more_of_a, 1)
        assert (requests.of("a"), requests.share()) == (5, 8)

    run_apart(scenario)


def test_a_share_is_never_below_one() -> None:
    async def scenario() -> None:
        requests = RequestsInFlight(2, max_queued=4, max_wait=5)
        for tenant in ("a", "b", "c"):
            assert await requests.enter(tenant)  # each active tenant holds one at least
        assert requests.share() == 1

    run_apart(scenario)


def test_a_request_back_from_its_wait_takes_its_place_again_through_its_tenants_line() -> None:
    """`set_aside`: a waiting request counts for nothing; back from its wait it goes through its tenant's
    line as a new request would, never past the cap."""

    async def scenario() -> None:
        requests = RequestsInFlight(2, max_queued=1, max_wait=5)
        assert await requests.enter("a")  # the request that will wait
        aside = requests.set_aside("a")
        await aside.__aenter__()
        assert requests.of("a") == 0
        for _ in range(2):  # while it waits, the tenant's cap fills
            assert await requests.enter("a")
        back = asyncio.ensure_future(aside.__aexit__(None, None, None))
        await asyncio.sleep(0)
        assert (back.done(), requests.of("a"), requests.queued("a")) == (False, 2, 1)  # in the line
        requests.leave("a")  # a slot frees: it goes to the request back from its wait
        await asyncio.wait_for(back, 1)
        assert (requests.of("a"), requests.queued("a")) == (2, 0)

    run_apart(scenario)


def test_a_request_back_from_its_wait_to_a_full_line_is_refused_and_counted_once() -> None:
    async def scenario() -> None:
        requests = RequestsInFlight(1, max_queued=0, max_wait=5)
        assert await requests.enter("a")
        with pytest.raises(NoPlaceAgain):
            async with requests.set_aside("a"):
                assert await requests.enter("a")  # another takes the only slot meanwhile
        # Refused (it answers 429): counted past the cap until its own `leave`, as it ends.
        assert requests.of("a") == 2
        requests.leave("a")
        assert requests.of("a") == 1  # the other's, which it did not hand on
        requests.leave("a")
        assert requests.of("a") == 0

    run_apart(scenario)


def test_a_request_whose_wait_fails_is_counted_again_at_once() -> None:
    async def scenario() -> None:
        requests = RequestsInFlight(1, max_queued=0, max_wait=5)
        assert await requests.enter("a")

        async def wait_in_vain() -> None:
            async with requests.set_aside("a"):
                assert await requests.enter("a")  # another takes the only slot meanwhile
                raise TimeoutError

        with pytest.raises(TimeoutError):
            await wait_in_vain()
        # It only answers now (an error), reading nothing: counted again past the cap, until it ends.
        assert requests.of("a") == 2
        requests.leave("a")
        requests.leave("a")
        assert requests.of("a") == 0

    run_apart(scenario)
