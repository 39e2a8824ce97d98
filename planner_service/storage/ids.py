"""The formats of ids and names the storage issues or accepts, checked before any query (a
string that cannot be an id is a 404 without touching the database)."""

from __future__ import annotations

import re

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,100}$")
_TENANT = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")


def is_uuid(value: object) -> bool:
    """An id this service issued (lower-case UUID text)."""
    return isinstance(value, str) and bool(_UUID.match(value))


def is_request_hash(value: object) -> bool:
    return isinstance(value, str) and bool(_HASH.match(value))


def is_name(value: object) -> bool:
    """A saved-cluster name: 1-100 letters, digits, '.', '_', '-'."""
    return isinstance(value, str) and bool(_NAME.match(value))


def is_tenant(value: object) -> bool:
    """A tenant name: 1-100 lower-case letters, digits, '.', '_', '-', not starting with a symbol."""
    return isinstance(value, str) and bool(_TENANT.match(value))


__all__ = ["is_name", "is_request_hash", "is_tenant", "is_uuid"]
