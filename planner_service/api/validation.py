"""Edge checks of strings before anything reaches the planner or the database.

PostgreSQL refuses NUL characters in text, and a lone UTF-16 surrogate (``"\\ud800"``, legal in
JSON) cannot be encoded to UTF-8 by any driver: both used to surface as 500s after the search
had run.  Every string that enters the service is checked here first:

* request bodies (JSON): parsed once by :func:`check_json_body` with a depth bound, finite
  numbers only, and every key and string value free of NUL and lone surrogates, of bounded
  length;
* paths and query strings: :func:`bad_query_field` / :func:`bad_path`;
* ids: :func:`is_uuid`, :func:`is_request_hash`, :func:`is_name` before any query.

Parser failures (not UTF-8, a number literal too large for Python, nesting beyond
:data:`MAX_JSON_DEPTH`) are :class:`BadBody` → 422 with field ``body`` like every other bad
input.
"""

from __future__ import annotations

import json
import math
from typing import Any
from urllib.parse import parse_qsl

from planner_service.storage.ids import is_name, is_request_hash, is_uuid

#: Deepest JSON nesting accepted (a plan request nests about 6 levels; graphs and traces < 20).
MAX_JSON_DEPTH = 64
#: Longest string accepted anywhere in a body or a query parameter.
MAX_STRING_CHARS = 100_000
#: Longest query parameter value (names, hashes, ids, launch parameters).
MAX_QUERY_CHARS = 4_096



class BadBody(ValueError):
    """The request body cannot be accepted; ``message`` says why, ``field`` where."""

    def __init__(self, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.message = message
        self.field = field


def text_problem(value: str, max_chars: int = MAX_STRING_CHARS) -> str | None:
    """Why ``value`` cannot be stored (NUL, lone surrogate, too long), or None."""
    if len(value) > max_chars:
        return f"is longer than {max_chars} characters"
    if "\x00" in value:
        return "contains a NUL character"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone UTF-16 surrogate (not valid Unicode text)"
    return None


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise BadBody(f"number {literal[:40]!r} is out of range")
    return value


def _reject_constant(name: str) -> Any:
    raise BadBody(f"{name} is not a JSON number")


def _path(parts: list[Any]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else ("." if out else "") + str(p)
    return out or "body"


def _walk(value: Any) -> None:
    """Iterative walk: every key and string checked, nesting bounded."""
    stack: list[tuple[Any, list[Any]]] = [(value, [])]
    while stack:
        node, where = stack.pop()
        if len(where) > MAX_JSON_DEPTH:
            raise BadBody(f"nests deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(node, str):
            problem = text_problem(node)
            if problem:
                raise BadBody(f"a string {problem}", _path(where))
        elif isinstance(node, dict):
            for key, item in node.items():
                problem = text_problem(key, 1_000)
                if problem:
                    raise BadBody(f"a key {problem}", _path(where))
                stack.append((item, [*where, key]))
        elif isinstance(node, list):
            stack.extend((item, [*where, i]) for i, item in enumerate(node))


def check_json_body(raw: bytes) -> None:
    """Raise :class:`BadBody` unless ``raw`` is UTF-8 JSON the service can take."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadBody(f"the body is not UTF-8 (byte {exc.start})") from None
    # Depth first, on the text: json.loads recurses and would hit Python's recursion limit.
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise BadBody(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
        elif ch in "]}":
            depth -= 1
    try:
        value = json.loads(text, parse_float=_finite_float, parse_constant=_reject_constant)
    except BadBody:
        raise
    except json.JSONDecodeError as exc:
        raise BadBody(f"the body is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except (ValueError, RecursionError) as exc:  # an integer literal over Python's digit limit
        raise BadBody(f"the body is not acceptable JSON ({type(exc).__name__}: a number literal too large)") from None
    _walk(value)


def bad_query_field(query_string: bytes) -> tuple[str, str] | None:
    """``(parameter, problem)`` for the first query parameter that cannot be accepted."""
    if not query_string:
        return None
    try:
        text = query_string.decode("latin-1")
        pairs = parse_qsl(text, keep_blank_values=True, encoding="utf-8", errors="strict")
    except (UnicodeDecodeError, ValueError):
        return "query", "is not UTF-8"
    for key, value in pairs:
        for part in (key, value):
            problem = text_problem(part, MAX_QUERY_CHARS)
            if problem:
                return (key if text_problem(key, 200) is None else "query"), problem
    return None


def bad_path(path: str) -> bool:
    """A path no route can match (control characters, lone surrogates)."""
    return text_problem(path, 8_192) is not None or any(ord(c) < 0x20 for c in path)


__all__ = [
    "MAX_JSON_DEPTH",
    "BadBody",
    "bad_path",
    "bad_query_field",
    "check_json_body",
    "is_name",
    "is_request_hash",
    "is_uuid",
    "text_problem",
]
