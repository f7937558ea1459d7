"""Run tags: key/value strings given at a run's start (`Engine.start(tags=)`) or set by its nodes
(`NodeContext.set_tags`), kept in the run tables so that runs can be searched by them
(`workflows.search_runs`).

Tags are bounded, since every one is a row of an indexed table and is held by every load of its run: at
most LEDGERFLOW_MAX_TAGS_PER_RUN per run, keys of at most LEDGERFLOW_MAX_TAG_KEY_CHARS characters
(letters, digits and `_.:/-`), values of at most LEDGERFLOW_MAX_TAG_VALUE_CHARS printable characters.
A tag set over a bound raises TagLimitError (HTTP 422) and writes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from eventstore import InvalidInputError

_KEY = re.compile(r"[A-Za-z0-9_.:/-]+")


class TagLimitError(InvalidInputError):
    """A tag that is malformed, too long, or one too many for its run; nothing was written."""

    code = "run_tag_invalid"

    def __init__(self, message: str, *, limit: int | None = None, setting: str | None = None) -> None:
        self.limit, self.setting = limit, setting
        super().__init__(message)

    def details(self) -> dict[str, Any]:
        return {"limit": self.limit, "setting": self.setting} if self.setting else {}


class TagLimits(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LEDGERFLOW_", extra="ignore")

    #: Tags one run may carry at once (its start's and its nodes' together).
    max_tags_per_run: int = Field(default=32, ge=1, le=1000)
    #: The longest tag key, in characters.
    max_tag_key_chars: int = Field(default=64, ge=1, le=1000)
    #: The longest tag value, in characters.
    max_tag_value_chars: int = Field(default=256, ge=1, le=10000)

    def check(self, tags: object, *, removals: bool = False) -> dict[str, str | None]:
        """`tags` as a dict of checked keys and values (None values only with `removals`: they remove the
        key), or TagLimitError saying what to change."""
        if not isinstance(tags, Mapping):
            raise TagLimitError(f"tags must be a mapping of strings to strings, got {type(tags).__name__}")
        checked: dict[str, str | None] = {}
        for key, value in tags.items():
            checked[self._key(key)] = None if value is None and removals else self._value(key, value)
        self.check_count(len([v for v in checked.values() if v is not None]))
        return checked

    def merged(self, current: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
        """The tags a run has after `change` (checked) applies to `current`; TagLimitError if too many."""
        tags = apply_tags(current, change)
        self.check_count(len(tags))
        return tags

    def check_count(self, count: int) -> None:
        if count > self.max_tags_per_run:
            raise TagLimitError(
                f"a run may carry {self.max_tags_per_run} tags (LEDGERFLOW_MAX_TAGS_PER_RUN); this would "
                f"give it {count}. Nothing was written: remove tags (a value of None) or use fewer keys.",
                limit=self.max_tags_per_run,
                setting="LEDGERFLOW_MAX_TAGS_PER_RUN",
            )

    def _key(self, key: object) -> str:
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise TagLimitError(f"invalid tag key {key!r}: use letters, digits and _.:/-")
        if len(key) > self.max_tag_key_chars:
            raise TagLimitError(
                f"tag key {key[:40]!r}... has {len(key)} characters; the limit is {self.max_tag_key_chars} "
                "(LEDGERFLOW_MAX_TAG_KEY_CHARS)",
                limit=self.max_tag_key_chars,
                setting="LEDGERFLOW_MAX_TAG_KEY_CHARS",
            )
        return key

    def _value(self, key: str, value: object) -> str:
        if not isinstance(value, str) or not value.isprintable():
            raise TagLimitError(f"the value of tag {key!r} must be a string of printable characters")
        if len(value) > self.max_tag_value_chars:
            raise TagLimitError(
                f"the value of tag {key!r} has {len(value)} characters; the limit is "
                f"{self.max_tag_value_chars} (LEDGERFLOW_MAX_TAG_VALUE_CHARS)",
                limit=self.max_tag_value_chars,
                setting="LEDGERFLOW_MAX_TAG_VALUE_CHARS",
            )
        return value


def apply_tags(current: Mapping[str, str], change: Mapping[str, str | None]) -> dict[str, str]:
    """`current` with `change` applied: a key gets its value, a None value removes the key."""
    tags = dict(current)
    for key, value in change.items():
        if value is None:
            tags.pop(key, None)
        else:
            tags[key] = value
    return tags


def parse_tag(text: str) -> tuple[str, str]:
    """`KEY=VALUE` (as the CLI and the API's `tag` parameter take it) as (key, value)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise TagLimitError(f"tag {text!r} must read KEY=VALUE")
    return key, value
