"""One bad field never costs a whole batch: the slow path of message validation.

The fast path (``schema.validate``) checks a message in pydantic-core straight from
the JSON text. When it fails, or the text holds a NUL escape, this module looks
closer, and only then:

- an over-long name (a dict key or a name field, over ``MAX_NAME_CHARS``) is
  shortened with :func:`gradwatch.protocol.names.short_name`, as the trainer does;
- an optional field of a record that holds a count beyond int64 or a NUL character
  (what a correct trainer may still produce) is left out of that record;
- an optional field of a step or epoch record that fails validation in any other way
  (a string where a number is expected, a list where an object is, a negative count,
  a malformed series) is left out of that record: one bad field never costs the rest
  of a record;
- each field left out leaves a notice (``field: expected X, got Y; the field was left
  out``), which the ack carries back to the trainer (``ack.notice``);
- what identifies a run (``run_id``, ``session``), frames a batch (``seq``, ``rank``)
  or a record (``kind``, and ``step`` of a step record, ``code`` of an alert...) is
  never repaired, nor a wrong field of an alert or end record (it would change what
  the record says), nor text that is not strict JSON (a bare ``NaN`` token): the
  message is refused (1007) with the reason, as before.

Example:
    >>> text = ('{"type":"batch","run_id":"r","rank":0,"seq":0,"records":'
    ...         '[{"kind":"step","step":1,"loss":0.5,"rss_bytes":18446744073709551616}]}')
    >>> batch, notices = parse_repairing(text)
    >>> batch.records[0].loss, batch.records[0].rss_bytes
    (0.5, None)
    >>> notices  # doctest: +NORMALIZE_WHITESPACE
    ['records[0].rss_bytes: expected less than or equal to 9223372036854775807,
      got 18446744073709551616; the field was left out']
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gradwatch.protocol import messages as m
from gradwatch.protocol.names import identity_problem, short_name

from .schema import (
    INT64_MAX,
    Batch,
    Hello,
    check_columns,
    validate,
)
from .schema_errors import ProtocolError, describe_error, describe_value, field_path

# Fields a record cannot be stored without.
REQUIRED = {"step": ("kind", "step"), "epoch": ("kind", "epoch"), "alert": ("kind", "code"),
            "end": ("kind", "status")}
# Records whose every optional field may be left out when it fails validation. An
# alert's or an end's fields change what the record means (a clear read as a raise,
# a default severity): those records are refused whole, as before.
ANY_FIELD_LEFT_OUT = ("step", "epoch")
MAX_ROUNDS = 4
MAX_NOTICES = 20


def parse_repairing(text: str | bytes) -> tuple[Hello | Batch, list[str]]:
    """The message and the notices of what was left out of it (empty: nothing).

    Raises :class:`ProtocolError` for what cannot be repaired.
    """
    try:
        message = validate(text)
    except ValidationError as error:
        return _repair(text, error)
    # Only an escape puts a NUL in a JSON string (a raw one is invalid JSON). A batch
    # is mostly base64, which has no backslash: one memchr says so (~3 µs for 300 KB,
    # where the six-character search took ~150 µs, 1.5 µs of every record's ingest).
    slash, nul = (b"\\", b"\\u0000") if isinstance(text, bytes) else ("\\", "\\u0000")
    if slash in text and nul in text:  # type: ignore[operator]
        return _repair(text, None)
    return check_columns(message), []


def _contains_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_contains_nul(k) or _contains_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_contains_nul(v) for v in value)
    return False


def _not_json(token: str) -> Any:
    raise ValueError(f"{token} is not JSON")


def _repair(text: str | bytes, error: ValidationError | None) -> tuple[Hello | Batch, list[str]]:
    try:
        obj = json.loads(text, parse_constant=_not_json)
    except ValueError:
        obj = None
    if not isinstance(obj, dict) or obj.get("type") not in (m.HELLO, m.BATCH):
        if error is None:
            raise ProtocolError(m.CLOSE_INVALID_DATA, "expected one JSON object, got other JSON")
        raise describe_error(error) from None
    if obj["type"] == m.HELLO:
        return _repair_hello(obj), []
    return _repair_batch(obj)


def _refuse_identity(obj: dict[str, Any], fields: tuple[str, ...]) -> None:
    for name in fields:
        if name in obj and not (name == "session" and obj[name] == ""):
            problem = identity_problem(obj[name], name)
            if problem is not None:
                raise ProtocolError(m.CLOSE_INVALID_DATA, problem)


def _repair_hello(obj: dict[str, Any]) -> Hello:
    _refuse_identity(obj, ("run_id", "session"))
    for name, value in obj.items():
        if _contains_nul(value):
            raise ProtocolError(
                m.CLOSE_INVALID_DATA, f"{name}: expected text without NUL (U+0000), got one"
            )
    for name in ("run", "host"):
        if isinstance(obj.get(name), str):
            obj[name] = short_name(obj[name])
    model = obj.get("model")
    if isinstance(model, dict):
        for module in model.get("modules") or []:
            if isinstance(module, dict):
                for key in ("name", "type"):
                    if isinstance(module.get(key), str):
                        module[key] = short_name(module[key])
        if isinstance(model.get("recurrent"), list):
            model["recurrent"] = [
                short_name(r) if isinstance(r, str) else r for r in model["recurrent"]
            ]
    try:
        message = validate(json.dumps(obj))
    except ValidationError as error:
        raise describe_error(error) from None
    assert isinstance(message, Hello)
    return message


def _repair_batch(obj: dict[str, Any]) -> tuple[Batch, list[str]]:
    _refuse_identity(obj, ("run_id",))
    records = obj.get("records")
    notices: list[str] = []
    if isinstance(records, list):
        for index, record in enumerate(records):
            if isinstance(record, dict):
                for name in [k for k, v in record.items() if _contains_nul(k) or _contains_nul(v)]:
                    why = f"records[{index}].{name}: expected text without NUL (U+0000), got one"
                    if not _leave_out(record, name, why, notices):
                        raise ProtocolError(m.CLOSE_INVALID_DATA, why)
    for _ in range(MAX_ROUNDS):
        try:
            message = validate(json.dumps(obj))
        except ValidationError as error:
            if not isinstance(records, list) or not _fix(error, records, notices):
                raise describe_error(error) from None
            continue
        assert isinstance(message, Batch)
        check_columns(message)
        if len(notices) > MAX_NOTICES:
            notices = [*notices[:MAX_NOTICES], f"and {len(notices) - MAX_NOTICES} more"]
        return message, notices
    raise ProtocolError(m.CLOSE_INVALID_DATA, "records: could not be repaired: " + "; ".join(
        notices[:3]))


def _fix(error: ValidationError, records: list[Any], notices: list[str]) -> bool:
    """Repair what each error points at; False when one cannot be repaired (it is
    outside the records, or in a field a record cannot be stored without)."""
    problems = error.errors(include_url=False)
    fields: dict[tuple[int, str], list[Any]] = {}
    for problem in problems:
        loc = problem["loc"]
        if len(loc) < 5 or loc[:2] != ("batch", "records") or not isinstance(loc[2], int):
            return False
        kind = str(loc[3])
        record = records[loc[2]]
        if not isinstance(record, dict) or loc[4] in REQUIRED.get(kind, ("kind",)):
            return False
        if not (_repairable(problem) or kind in ANY_FIELD_LEFT_OUT):
            return False
        fields.setdefault((loc[2], str(loc[4])), []).append(problem)
    for (index, name), found in fields.items():
        record = records[index]
        if not all(_repairable(p) for p in found):
            # A wrong type, a negative count, a malformed series: the field goes, the
            # record stays (with the reason, as a refusal would have given it).
            _leave_out(record, name, _field_problem(record, index, name), notices)
            continue
        for problem in found:
            loc = problem["loc"]
            if problem["type"] == "string_too_long" and _shorten(record, loc[4:]):
                continue
            got = describe_value(problem.get("input"))
            why = f"{field_path(loc)}: {_expected(problem)}, got {got}"
            _leave_out(record, name, why, notices)
    return True


def _field_problem(record: dict[str, Any], index: int, name: str) -> str:
    """``records[i].field: expected X, got Y`` for one field, worded as a refusal is."""
    kind = str(record.get("kind"))
    probe: dict[str, Any] = {"kind": kind, **{k: 0 for k in REQUIRED[kind] if k != "kind"}}
    probe[name] = record.get(name)
    text = json.dumps({"type": m.BATCH, "run_id": "r", "rank": 0, "seq": 0, "records": [probe]})
    try:
        validate(text)
    except ValidationError as error:
        return describe_error(error).message.replace("records[0]", f"records[{index}]", 1)
    got = describe_value(record.get(name))
    return f"records[{index}].{name}: expected a valid value, got {got}"


def _repairable(problem: Any) -> bool:
    """What a correct trainer can send and keeps its field: a long name (shortened).
    A count past int64 or a NUL leave the field out, in records of any kind."""
    kind = problem["type"]
    bound = problem.get("ctx", {})
    return bool(
        kind == "string_too_long"
        or (kind == "less_than_equal" and bound.get("le") == INT64_MAX)
        or (kind == "greater_than_equal" and bound.get("ge") == -INT64_MAX - 1)
    )


def _expected(problem: Any) -> str:
    msg = str(problem["msg"])
    return "expected " + msg.removeprefix("Input should be ").removeprefix("Input ")


def _leave_out(record: dict[str, Any], field: str, why: str, notices: list[str]) -> bool:
    """Take ``field`` out of ``record`` with a notice; False for a required field."""
    if field in REQUIRED.get(str(record.get("kind")), ("kind",)):
        return False
    if field in record:
        del record[field]
        notices.append(f"{why}; the field was left out")
    return True


def _shorten(record: Any, path: tuple[Any, ...]) -> bool:
    """Shorten the over-long name at ``path`` (a key ends in '[key]'); True when done."""
    node = record
    steps = [p for p in path if not str(p).startswith(("function", "constrained-"))]
    is_key = bool(steps) and steps[-1] == "[key]"
    if is_key:
        steps = steps[:-1]
    for step in steps[:-1]:
        in_list = isinstance(node, list) and isinstance(step, int) and step < len(node)
        if in_list or (isinstance(node, dict) and step in node):
            node = node[step]
        else:
            return False
    if not steps:
        return False
    last = steps[-1]
    if is_key and isinstance(node, dict) and isinstance(last, str) and last in node:
        short = short_name(last)
        node[short] = node.pop(last)
        return True
    container = node
    if isinstance(container, dict) and last in container and isinstance(container[last], str):
        container[last] = short_name(container[last])
        return True
    return False
