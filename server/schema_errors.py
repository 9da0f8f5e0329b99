"""How a message that failed validation is told to its sender: the first problem as
``field: expected X, got Y``, with the websocket close code that says why.

Example:
    >>> from gradwatch.server.schema import parse_message
    >>> try:
    ...     parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0,'
    ...                   ' "records": [{"kind": "step", "step": 0, "loss": true}]}')
    ... except ProtocolError as e:
    ...     print(e.message)
    records[0].loss: expected a number or "NaN"/"Infinity"/"-Infinity", got True
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from gradwatch.protocol import messages as m


class ProtocolError(ValueError):
    """A message the server refuses, with the websocket close code that says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def describe_value(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_KINDS = "'step', 'epoch', 'alert' or 'end'"
_BRANCHES = ("float", "literal[", "function", "constrained-", "list[union[", "PackedSeries")
_SERIES = 'expected a list of numbers or {"f64": "<base64 of little-endian float64>"}'


def _series_errors(errors: list[Any]) -> list[Any]:
    """A series is a list or a packed object: report the branch the input took."""
    first = errors[0]
    if first["type"] != "list_type" or not str(first["loc"][-1]).startswith("list[union["):
        return errors
    packed = [e for e in errors[1:] if "PackedSeries" in e["loc"]]
    if packed and packed[0]["type"] != "model_type":
        return packed  # an object: what is wrong with it as a packed series
    return [{**first, "type": "series_type"}]


def field_path(loc: tuple[int | str, ...]) -> str:
    """``('batch', 'records', 3, 'step', 'loss')`` as ``records[3].loss``."""
    parts = list(loc)
    if parts and parts[0] in ("hello", "batch"):
        parts = parts[1:]  # the message's own tag
    out = ""
    previous: int | str | None = None
    for i, part in enumerate(parts):
        if isinstance(part, int):
            out += f"[{part}]"
        elif str(part).startswith(_BRANCHES):
            pass  # a branch of a union (number, series), not a field
        elif (
            previous is not None
            and isinstance(previous, int)
            and i >= 2
            and parts[i - 2] == "records"
            and part in m.RECORD_KINDS
        ):
            pass  # the record's tag
        else:
            out += ("." if out else "") + str(part)
        previous = part
    return out


def _width(path: str) -> str:
    return "int64" if path.endswith(".i64") else "float64"


def describe_error(error: ValidationError) -> ProtocolError:
    """The first problem of a failed validation as ``field: expected X, got Y``."""
    errors = _series_errors(error.errors(include_url=False))
    first = errors[0]
    kind = first["type"]
    path = field_path(first["loc"])
    got = describe_value(first.get("input"))
    where = f"{path}: " if path else ""
    if kind in ("json_invalid", "json_type"):
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f"expected one JSON object, got invalid JSON ({first['msg']})"
        )
    if kind == "union_tag_invalid":
        if not path:
            tag = first.get("ctx", {}).get("tag")
            return ProtocolError(
                m.CLOSE_POLICY, f"type: expected 'hello' or 'batch', got {describe_value(tag)}"
            )
        tag = first.get("ctx", {}).get("tag")
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f"{path}.kind: expected {_KINDS}, got {describe_value(tag)}"
        )
    if kind == "union_tag_not_found":
        if not path:
            return ProtocolError(
                m.CLOSE_INVALID_DATA, "type: expected 'hello' or 'batch', got no 'type' field"
            )
        return ProtocolError(m.CLOSE_INVALID_DATA, f"{path}.kind: expected {_KINDS}, got nothing")
    if kind == "series_type":
        return ProtocolError(m.CLOSE_INVALID_DATA, f"{where}{_SERIES}, got {got}")
    if kind == "bytes_invalid_encoding":
        detail = str(first["msg"]).rpartition(": ")[2].rstrip(".")
        return ProtocolError(
            m.CLOSE_INVALID_DATA,
            f"{where}expected base64 of little-endian {_width(path)} values, got invalid base64"
            f" ({detail})",
        )
    if kind == "bytes_too_long":
        return ProtocolError(
            m.CLOSE_INVALID_DATA,
            f"{where}expected at most {m.MAX_TIMESTEPS} float64 values"
            f" ({8 * m.MAX_TIMESTEPS} bytes), got more",
        )
    if kind == "bytes_type":
        return ProtocolError(m.CLOSE_INVALID_DATA, f"{where}expected a base64 string, got {got}")
    if kind == "extra_forbidden" and path.startswith("columns["):
        return ProtocolError(
            m.CLOSE_INVALID_DATA,
            f"{where}expected only the fields of a step block (docs/PROTOCOL.md, columns;"
            f" a record with other fields travels in records), got {got}",
        )
    if kind == "extra_forbidden":
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f'{where}expected only "f64" in a packed series, got {got}'
        )
    if kind == "value_error" and str(first["msg"]).startswith("Value error, expected"):
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f"{where}{str(first['msg']).removeprefix('Value error, ')}"
        )
    if kind == "missing":
        return ProtocolError(m.CLOSE_INVALID_DATA, f"{where}expected a value, got nothing")
    number_union = (
        len(errors) >= 2
        and errors[0]["loc"][:-1] == errors[1]["loc"][:-1]
        and str(errors[1]["loc"][-1]).startswith("literal[")
    )
    if number_union:
        expected = 'expected a number or "NaN"/"Infinity"/"-Infinity"'
    else:
        msg = str(first["msg"])
        expected = "expected " + msg.removeprefix("Input should be ").removeprefix("Input ")
    return ProtocolError(m.CLOSE_INVALID_DATA, f"{where}{expected}, got {got}")
