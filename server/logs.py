"""Tokens never reach the log: ``?token=...`` in logged paths is redacted.

Viewer links carry the view token in the query (``?token=``); uvicorn's access log
and its websocket lines print the path with its query. :class:`RedactTokens` is a
logging filter on uvicorn's handlers (see :func:`log_config`) that rewrites every
``token=<value>`` of a record's arguments and message as ``token=<redacted>``.

Example:
    >>> redact('GET /api/runs?token=s3cret&x=1 HTTP/1.1')
    'GET /api/runs?token=<redacted>&x=1 HTTP/1.1'
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any

_TOKEN = re.compile(r"(?i)((?:^|[?&;])(?:access_)?token=)[^&\s\"']*")


def redact(text: str) -> str:
    """``text`` with every ``token=<value>`` query parameter's value replaced."""
    return _TOKEN.sub(r"\1<redacted>", text)


class RedactTokens(logging.Filter):
    """Rewrites token values in a record's message and string arguments."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "token=" in record.msg.lower():
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact(a) if isinstance(a, str) and "token=" in a.lower() else a
                for a in record.args
            )
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration with :class:`RedactTokens` on every handler."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_tokens"] = {"()": RedactTokens}
    for handler in config.get("handlers", {}).values():
        handler.setdefault("filters", []).append("redact_tokens")
    return config
