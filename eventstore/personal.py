"""Personal fields: which fields of which event types hold a subject's personal data, sealing them at
append (AES-GCM, with the subject's data key from `eventstore.keys`) and revealing them at read.

A sealed field is stored in the log as an envelope in place of its value:
`{"$personal": 1, "subject": "<subject>", "key": "<key id>", "nonce": "<base64>", "ct": "<base64>"}`.
Once its subject is forgotten, reads answer `REDACTED` in its place; the event keeps its id, position,
version and every other field. Only top-level fields of an event's data can be personal.

Declared either on a pydantic model (`email: Annotated[str, Personal(subject="customer_id")]`, picked up
when the model is registered as an event type) or per type for events appended as dicts
(`personal_fields("OrderPlaced", subject="customer_id", fields=["email", "address"])`).
"""

from __future__ import annotations

import base64
import os
import threading
import uuid
from binascii import a2b_base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pydantic

from eventstore import jsonvalue
from eventstore._validation import check_event_type, dumped_json_object
from eventstore.errors import EventDecodeError, InvalidInputError
from eventstore.events import NewEvent
from eventstore.keys import SubjectKey, SubjectKeys, check_subject
from eventstore.masterkeys import KEY_BYTES, NONCE_BYTES, aes_gcm

#: What reads answer in place of a personal field whose subject was forgotten.
REDACTED = "[forgotten]"
MARK = "$personal"
#: The mark as it appears in a stored event's JSON text: rows without it are passed on untouched.
_MARK_TEXT = '"$personal"'


@dataclass(frozen=True, slots=True)
class Personal:
    """Marks a model field as personal data of the subject whose id is in the field `subject`."""

    subject: str


#: Per event type: personal field -> the field holding its subject's id.
_declared: dict[str, dict[str, str]] = {}
_declared_lock = threading.Lock()


def personal_fields(event_type: str, *, subject: str, fields: Sequence[str]) -> None:
    """Declare `fields` of `event_type` personal data of the subject named by the field `subject`.
    Declaring the same again is a no-op; declaring a field with another subject is refused."""
    check_event_type(event_type)
    if isinstance(fields, str) or not fields:
        raise InvalidInputError("personal_fields needs a list of field names, e.g. fields=['email']")
    if subject in fields:
        raise InvalidInputError(f"the subject field {subject!r} cannot itself be personal: it finds the key")
    _declare(event_type, dict.fromkeys(fields, subject))


def declare_model(event_type: str, model: type[pydantic.BaseModel]) -> None:
    """Declare the fields of `model` annotated with `Personal(...)` (a no-op for a model without any)."""
    found = {
        name: marker.subject
        for name, info in model.model_fields.items()
        for marker in info.metadata
        if isinstance(marker, Personal)
    }
    for name, subject in found.items():
        if subject not in model.model_fields or subject in found:
            raise InvalidInputError(
                f"{model.__name__}.{name} is Personal(subject={subject!r}), but {subject!r} is not a "
                "non-personal field of the model: name the field that holds the subject's id"
            )
    if found:
        _declare(event_type, found)


def _declare(event_type: str, fields: dict[str, str]) -> None:
    with _declared_lock:
        known = dict(_declared.get(event_type, {}))
        for name, subject in fields.items():
            if known.get(name, subject) != subject:
                raise InvalidInputError(
                    f"field {name!r} of {event_type!r} is already personal data of subject field "
                    f"{known[name]!r}"
                )
            known[name] = subject
        _declared[event_type] = known


def declared(event_type: str) -> Mapping[str, str]:
    """The personal fields of `event_type` and their subject fields (empty: none)."""
    return _declared.get(event_type, {})


def _aad(tenant: str, subject: str, event_type: str, field: str, event_id: uuid.UUID) -> bytes:
    """A ciphertext is bound to its place: copied into another field, event, subject or tenant, it does
    not decrypt."""
    return _aad_prefix(tenant, subject, event_type, field) + event_id.bytes


def _aad_prefix(tenant: str, subject: str, event_type: str, field: str) -> bytes:
    """`_aad` but for the event id, which comes last."""
    return f"{tenant}\x00{subject}\x00{event_type}\x00{field}\x00".encode()


class Shredder:
    """Seals personal fields at append and reveals (or redacts) them at read, for one event store."""

    def __init__(self, keys: SubjectKeys) -> None:
        self.keys = keys

    def seal(self, tenant: str, event: NewEvent) -> Mapping[str, Any]:
        """The data to store for `event`: its own, or a copy with its personal fields sealed."""
        data = event.data
        fields = _declared.get(event.type)
        if not fields:
            if isinstance(data, Mapping):
                _refuse_envelopes(event.type, data)
            return data
        if not isinstance(data, Mapping):
            return data  # refused with its reason where the stored data is checked
        _refuse_envelopes(event.type, data)
        sealed = dict(data)
        for name, subject_field in fields.items():
            if name not in data:
                continue
            if subject_field not in data:
                raise InvalidInputError(
                    f"event {event.type!r} has personal field {name!r} of the subject in field "
                    f"{subject_field!r}, which its data lacks; nothing was written. Add the subject's id."
                )
            subject = check_subject(data[subject_field])
            key = self.keys.key_for_append(tenant, subject)
            # A forgotten subject's data is sealed with a key nobody keeps: forgotten as it is written.
            cipher = key.cipher or aes_gcm(os.urandom(KEY_BYTES))
            # Checked as the stored data is (the ciphertext hides it from that check): sealed as the JSON
            # object {name: value}, which is also what a read decodes.
            plain, problem = dumped_json_object({name: data[name]})
            if problem is not None:
                raise InvalidInputError(f"data of event {event.type!r} {problem}")
            nonce = os.urandom(NONCE_BYTES)
            sealed[name] = {
                MARK: 1,
                "subject": subject,
                "key": key.key_text,
                "nonce": base64.b64encode(nonce).decode(),
                "ct": base64.b64encode(
                    cipher.encrypt(
                        nonce, plain.encode(), _aad(tenant, subject, event.type, name, event.event_id)
                    )
                ).decode(),
            }
        return sealed

    def reveal(self, conn: psycopg.Connection[Any], rows: list[Any], offset: int) -> list[Any]:
        """`rows` of a read (each: a running size, then the event's columns, after `offset` leading
        columns) with personal fields decrypted, or `REDACTED` where their subject was forgotten; the data
        column of such a row becomes the decoded dict (the readers decode it no more). Which keys live is
        read on `conn` at this moment (their secrets may have been unwrapped before: see
        `SubjectKeys.keys_for_read`)."""
        data_at = offset + 8
        # One pass over each marked row's fields: its sealed ones, and the subjects whose keys they need.
        sealed: list[tuple[int, dict[str, Any], list[tuple[str, dict[str, Any]]]]] = []
        wanted: set[tuple[str, str]] = set()
        for i, row in enumerate(rows):
            text = row[data_at]
            if text is None or _MARK_TEXT not in text:
                continue
            data = jsonvalue.loads(text)
            fields = [(name, value) for name, value in data.items() if type(value) is dict and MARK in value]
            tenant = row[offset + 3]
            for _, envelope in fields:
                wanted.add((tenant, envelope["subject"]))
            sealed.append((i, data, fields))
        if not sealed:
            return rows
        keys = self.keys.keys_for_read(conn, wanted) if wanted else {}
        # What each field needs, built once per page and not once per field: its additional data but for
        # the event id, by (tenant, subject, type, field).
        prefixes: dict[tuple[str, str, str, str], bytes] = {}
        out = list(rows)
        for i, data, fields in sealed:
            row = rows[i]
            tenant, event_id, event_type = row[offset + 3], row[offset + 6], row[offset + 7]
            for name, envelope in fields:
                subject = envelope["subject"]
                place = (tenant, subject, event_type, name)
                prefix = prefixes.get(place)
                if prefix is None:
                    prefix = prefixes[place] = _aad_prefix(*place)
                data[name] = _open(keys.get((tenant, subject)), name, envelope, prefix + event_id.bytes)
            out[i] = (*row[:data_at], data, *row[data_at + 1 :])
        return out


def _refuse_envelopes(event_type: str, data: Mapping[str, Any]) -> None:
    """Data may not carry what looks like a sealed field: reads would take it for one."""
    for name, value in data.items():
        if isinstance(value, Mapping) and MARK in value:
            raise InvalidInputError(
                f"field {name!r} of event {event_type!r} holds an object with the key {MARK!r}, which "
                "marks sealed personal data; nothing was written. Rename that key."
            )


def _open(key: SubjectKey | None, name: str, envelope: dict[str, Any], aad: bytes) -> Any:
    if key is None or key.cipher is None or key.key_text != envelope.get("key"):
        return REDACTED
    from cryptography.exceptions import InvalidTag  # loaded already: key.cipher is an AESGCM

    try:
        plain = key.cipher.decrypt(a2b_base64(envelope["nonce"]), a2b_base64(envelope["ct"]), aad)
    except (InvalidTag, KeyError, ValueError, TypeError) as exc:
        raise EventDecodeError(
            f"a personal field of subject {envelope.get('subject')!r} does not decrypt with its key: the "
            "stored ciphertext does not belong where it is"
        ) from exc
    return jsonvalue.loads(plain.decode())[name]  # `decode`: no copy of the bytes first
