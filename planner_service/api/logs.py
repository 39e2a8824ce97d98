"""Structured logs: one JSON object per line, with the request id of the request being served.

* :class:`RequestIdMiddleware` (api.middleware) takes ``X-Request-ID`` from the request when it
  is a plain token (letters, digits, ``._:-``, at most 128), otherwise makes one, puts it in
  :data:`REQUEST_ID` for the request's code (threads of the request pool included: Starlette runs
  sync routes with the request's context) and returns it in the ``X-Request-ID`` response header.
* :class:`JsonFormatter` writes ``ts``, ``level``, ``logger``, ``message``, ``request_id`` and,
  for a record with an exception (only ever logged at debug level here), its type and traceback.
* What is logged at error level never carries SQL parameters or request bodies: the engines are
  built with ``hide_parameters=True`` (storage.db) and the error handlers log the error's class.

:func:`log_config` is the ``logging.config.dictConfig`` (and uvicorn ``log_config``) of
``planner serve`` and ``planner worker``: uvicorn's own and access loggers go through the same
formatter.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: The id of the request this code serves (None outside a request).
REQUEST_ID: ContextVar[str | None] = ContextVar("planner_request_id", default=None)
REQUEST_ID_HEADER = "X-Request-ID"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id_from(value: str | None) -> str:
    """The client's id when it is a plain token, else a new one."""
    if value is not None and _TOKEN.fullmatch(value):
        return value
    return uuid.uuid4().hex


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None) or REQUEST_ID.get(),
        }
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on whatever ``sys.stderr`` is when a record is emitted, not the one it was
    when logging was configured: a ``planner serve`` or ``worker`` run inside another program that
    swaps ``sys.stderr`` for a while (a test runner's ``CliRunner``) would otherwise leave every
    later record to a closed stream."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__/setStream assign it: always sys.stderr
        pass


_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def log_config(level: str = "info", fmt: str = "json") -> dict[str, Any]:
    """dictConfig for the root, ``uvicorn``, ``uvicorn.error`` and ``uvicorn.access`` loggers."""
    formatter: dict[str, Any] = {"()": JsonFormatter} if fmt == "json" else {"format": _TEXT_FORMAT}
    lvl = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"request_id": {"()": RequestIdFilter}},
        "formatters": {"default": formatter},
        "handlers": {"default": {"()": StderrHandler, "formatter": "default", "filters": ["request_id"]}},
        "root": {"handlers": ["default"], "level": lvl},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": lvl, "propagate": False},
            "uvicorn.error": {"level": lvl},
            "uvicorn.access": {"handlers": ["default"], "level": lvl, "propagate": False},
        },
    }


__all__ = ["REQUEST_ID", "REQUEST_ID_HEADER", "JsonFormatter", "RequestIdFilter", "StderrHandler", "log_config", "request_id_from"]
