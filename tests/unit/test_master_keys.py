"""Master keys from the settings: parsed, fingerprinted, refused with a message that says what to set."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventstore import ConfigurationError, MasterKeyMissingError, MasterKeys, MasterKeyUnknownError
from eventstore import generate_master_key as new_key


def test_a_key_from_the_setting_or_a_file_is_the_same_key(tmp_path: Path) -> None:
    key = new_key()
    path = tmp_path / "master.key"
    path.write_text(f"  {key}\n")
    from_setting = MasterKeys.from_settings(key, None, None)
    from_file = MasterKeys.from_settings(None, path, None)
    assert from_setting.current is not None
    assert from_file.current is not None
    assert from_setting.current.key_id == from_file.current.key_id
    assert key not in repr(from_setting.current)  # never shown in logs or tracebacks


def test_the_url_safe_alphabet_is_accepted() -> None:
    raw = bytes(range(200, 232))
    standard = MasterKeys.from_settings(base64.b64encode(raw).decode(), None, None).current
    url_safe = MasterKeys.from_settings(base64.urlsafe_b64encode(raw).decode(), None, None).current
    assert standard is not None
    assert url_safe is not None
    assert standard.key_id == url_safe.key_id


@pytest.mark.parametrize("bad", ["short", base64.b64encode(b"x" * 16).decode(), "not base64 at all!!"])
def test_a_malformed_key_names_what_to_give(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="32 random bytes"):
        MasterKeys.from_settings(bad, None, None)


def test_both_settings_or_an_unreadable_file_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="keep one of them"):
        MasterKeys.from_settings(new_key(), tmp_path / "k", None)
    with pytest.raises(ConfigurationError, match="cannot be read"):
        MasterKeys.from_settings(None, tmp_path / "missing", None)


def test_without_a_key_wrapping_says_what_to_set() -> None:
    with pytest.raises(MasterKeyMissingError, match="LEDGERFLOW_MASTER_KEY_FILE"):
        MasterKeys(None).wrap("t", "s", uuid.uuid4(), b"k" * 32)


@given(secret=st.binary(min_size=32, max_size=32), subject=st.text(min_size=1, max_size=20))
def test_a_previous_key_unwraps_what_it_wrapped(secret: bytes, subject: str) -> None:
    old, new = new_key(), new_key()
    key_id = uuid.uuid4()
    wrapped, master_id = MasterKeys.from_settings(old, None, None).wrap("t", subject, key_id, secret)
    both = MasterKeys.from_settings(new, None, old)
    assert both.unwrap("t", subject, key_id, wrapped, master_id) == secret
    with pytest.raises(MasterKeyUnknownError):
        MasterKeys.from_settings(new, None, None).unwrap("t", subject, key_id, wrapped, master_id)
    # Bound to its row: another subject's row does not unwrap it.
    with pytest.raises(ConfigurationError, match="does not unwrap"):
        both.unwrap("t", subject + "x", key_id, wrapped, master_id)
