"""`ops.api.lines.TenantLines`, the books of the API's per-tenant admission (requests in flight and
operator jobs): against a plain model, under any sequence of arrivals, departures and give-ups."""

from __future__ import annotations

from collections import deque

from hypothesis import given
from hypothesis import strategies as st

from ops.api.lines import TenantLines

TENANTS = ("a", "b", "c")
Step = tuple[str, str, int]
steps = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "release", "release_to_next", "give_up", "take_next"]),
        st.sampled_from(TENANTS),
        st.integers(0, 5),
    ),
    max_size=60,
)


@given(limit=st.integers(1, 3), max_queued=st.integers(0, 3), script=steps)
def test_a_tenant_never_holds_past_its_limit_nor_lines_up_past_its_line(
    limit: int, max_queued: int, script: list[Step]
) -> None:
    lines: TenantLines[str, int] = TenantLines(limit, max_queued)
    held = dict.fromkeys(TENANTS, 0)
    line: dict[str, deque[int]] = {t: deque() for t in TENANTS}
    given_up: set[int] = set()
    n = 0
    for action, tenant, k in script:
        if action == "arrive":
            n += 1
            if lines.take(tenant):
                assert held[tenant] < limit
                assert not line[tenant]  # nobody of its own is overtaken
                held[tenant] += 1
            elif lines.full(tenant):
                assert len(line[tenant]) >= max_queued
            else:
                lines.join(tenant, n)
                line[tenant].append(n)
        elif action == "release" and held[tenant]:
            assert lines.release(tenant) is None
            held[tenant] -= 1
        elif action == "release_to_next" and held[tenant]:
            handed = lines.release(tenant, hand_to=lambda i: i not in given_up)
            while line[tenant] and line[tenant][0] in given_up:
                line[tenant].popleft()
            if line[tenant]:
                assert handed == line[tenant].popleft()  # first come, first served; the slot stays held
            else:
                assert handed is None
                held[tenant] -= 1
        elif action == "give_up" and line[tenant]:
            quitter = line[tenant][k % len(line[tenant])]
            if k % 2:
                lines.leave_line(tenant, quitter)  # it leaves the line itself
                line[tenant].remove(quitter)
            else:
                given_up.add(quitter)  # it gave up, but is still in the line: a hand-over passes it by
        elif action == "take_next":
            taken = lines.take_next(tenant)
            if held[tenant] < limit and line[tenant]:
                assert taken == line[tenant].popleft()
                held[tenant] += 1
            else:
                assert taken is None
        for t in TENANTS:
            assert lines.held(t) == held[t] <= limit
            assert lines.waiting(t) == len(line[t]) <= max_queued
        assert lines.anyone_waiting() == any(line.values())


def test_hold_again_counts_past_the_limit() -> None:
    """Work set aside (a read waiting for a projection) comes back even when its tenant is at its cap."""
    lines: TenantLines[str, int] = TenantLines(limit=1, max_queued=1)
    assert lines.take("a")
    lines.release("a")
    assert lines.take("a")
    lines.hold_again("a")
    assert lines.held("a") == 2
    assert not lines.take("a")
