"""JSON encoding of protocol messages, with non-finite numbers as strings.

JSON has no NaN or infinity, and a browser's ``JSON.parse`` rejects Python's bare
``NaN`` token. Exploding gradients are exactly when those values appear, so they
must survive the trip: they travel as ``"NaN"``, ``"Infinity"`` and ``"-Infinity"``.

Example:
    >>> from gradwatch.protocol.codec import dumps, loads
    >>> dumps({"loss": float("inf")})
    '{"loss":"Infinity"}'
    >>> loads('{"loss": 1.5}')
    {'loss': 1.5}
"""

from __future__ import annotations

import base64
import json
import math
import sys
from array import array
from typing import Any

from .messages import NONFINITE_STRINGS

_SEPARATORS = (",", ":")


def _fast_encoder() -> Any:
    """pydantic-core's JSON encoder where it is installed and writes non-finite floats as
    the protocol's strings (``inf_nan_mode``); else None. On a step record of ~100 floats
    it is ~10x faster than ``json.dumps`` (float repr dominates), work the trainer's
    background thread does for every record (BENCHMARKS.md, "The background thread's JSON")."""
    try:
        from pydantic_core import to_json

        if to_json([math.nan, -math.inf], inf_nan_mode="strings") != b'["NaN","-Infinity"]':
            return None
    except Exception:  # not installed, or too old for inf_nan_mode
        return None
    return to_json


_FAST = _fast_encoder()


def protocol_number(value: Any) -> Any:
    """A number as the protocol writes it: a non-finite float becomes its string.

    >>> protocol_number(float("-inf")), protocol_number(2.5)
    ('-Infinity', 2.5)
    """
    if isinstance(value, float) and value - value != 0:
        return "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    return value


def _replace_nonfinite(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _replace_nonfinite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_replace_nonfinite(v) for v in value]
    return protocol_number(value)


def dumps(message: Any) -> str:
    """Encode one message as compact JSON; non-finite floats become strings."""
    if _FAST is not None:
        try:
            return str(_FAST(message, inf_nan_mode="strings").decode())
        except Exception:  # noqa: S110 - a type it does not know: the stdlib says which
            pass
    return dumps_json(message)


def dumps_json(message: Any) -> str:
    """:func:`dumps` by the standard library alone (the reference; the fallback)."""
    try:
        # Fast path: almost every message is finite, and allow_nan=False tells us
        # cheaply when one is not.
        return json.dumps(message, separators=_SEPARATORS, allow_nan=False)
    except ValueError:
        return json.dumps(_replace_nonfinite(message), separators=_SEPARATORS, allow_nan=False)


def _reject_constant(token: str) -> Any:
    raise ValueError(
        f"expected standard JSON, got the non-standard token {token!r}; "
        'send non-finite numbers as the strings "NaN", "Infinity" or "-Infinity"'
    )


def loads(text: str | bytes) -> Any:
    """Decode one message; bare ``NaN``/``Infinity`` tokens are an error."""
    return json.loads(text, parse_constant=_reject_constant)


def to_float(value: Any) -> float:
    """A protocol number (float, int or one of the non-finite strings) as a float."""
    if isinstance(value, str):
        try:
            return NONFINITE_STRINGS[value]
        except KeyError:
            raise ValueError(
                f'expected a number or "NaN"/"Infinity"/"-Infinity", got {value!r}'
            ) from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {type(value).__name__} {value!r}")
    return float(value)


_LITTLE = sys.byteorder == "little"


def packed_series(values: Any) -> Any:
    """A series of numbers in its packed wire form ``{"f64": base64}``: little-endian
    float64, every value exact (NaN and infinities included). Values that are not all
    numbers (the non-finite strings, say) stay as they are.

    >>> packed_series([1.0, 0.5])
    {'f64': 'AAAAAAAA8D8AAAAAAADgPw=='}
    """
    try:
        data = array("d", values)
    except TypeError:
        return values
    if not _LITTLE:
        data.byteswap()
    return {"f64": base64.b64encode(data).decode("ascii")}


def pack_timesteps(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with every step record's timestep series packed (copies; the records
    given are not changed). Encoding 128 numbers as JSON text costs ~10x packing them,
    here and in the server's parser (BENCHMARKS.md, "Ingest")."""
    out = []
    for record in records:
        timesteps = record.get("timesteps")
        if timesteps and isinstance(timesteps, dict) and record.get("kind") == "step":
            record = dict(record)
            record["timesteps"] = {
                module: {name: packed_series(v) for name, v in series.items()}
                if isinstance(series, dict)
                else series
                for module, series in timesteps.items()
            }
        out.append(record)
    return out
