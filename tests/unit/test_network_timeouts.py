"""Every connection gets libpq's TCP timeouts unless its URL sets its own (eventstore.db.NETWORK_TIMEOUTS)."""

from __future__ import annotations

import psycopg
from hypothesis import given
from hypothesis import strategies as st

from eventstore.db import NETWORK_TIMEOUTS, with_network_timeouts

URLS = [
    "postgresql://me:secret@db.example:5432/ledgerflow",
    "postgres://db1.example,db2.example/ledgerflow?target_session_attrs=read-write",
    "host=db.example port=5432 dbname=ledgerflow user=me",
]


@given(
    url=st.sampled_from(URLS),
    own=st.dictionaries(st.sampled_from(sorted(NETWORK_TIMEOUTS)), st.integers(0, 100).map(str)),
)
def test_the_urls_own_settings_win_and_the_others_are_added(url: str, own: dict[str, str]) -> None:
    if own:
        url = (
            psycopg.conninfo.make_conninfo(url, **own)
            if not url.startswith("postgres")
            else url + ("&" if "?" in url else "?") + "&".join(f"{k}={v}" for k, v in own.items())
        )
    before = psycopg.conninfo.conninfo_to_dict(url)
    after = psycopg.conninfo.conninfo_to_dict(with_network_timeouts(url))
    assert after == NETWORK_TIMEOUTS | before


def test_a_url_stays_a_url_and_one_with_everything_set_is_unchanged() -> None:
    url = with_network_timeouts(URLS[1])
    assert url.startswith(URLS[1] + "&keepalives=1&")
    assert with_network_timeouts(url) == url
