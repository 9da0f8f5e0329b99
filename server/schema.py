"""Pydantic models of protocol v1 (docs/PROTOCOL.md), built on the names in
``gradwatch.protocol.messages``.

Validation runs in pydantic-core straight from the JSON text (``validate_json``):
parsing and checking a 6 KB step record costs about as much as ``json.loads`` alone.
Numbers are strict: ``1.5`` or ``2``, or one of the strings ``"NaN"``, ``"Infinity"``,
``"-Infinity"``; a bare ``NaN`` token, a bool or ``"1.5"`` is refused. Unknown fields
are kept (extend, never rename: a newer trainer may send more).

Example:
    >>> msg = parse_message('{"type": "batch", "run_id": "r", "rank": 0, "seq": 0, '
    ...                     '"records": [{"kind": "step", "step": 0, "loss": "NaN"}]}')
    >>> msg.records[0].loss
    'NaN'
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    field_validator,
)

from gradwatch.protocol import messages as m

from .column_checks import check_batch

FiniteFloat = Annotated[float, Strict(), Field(allow_inf_nan=False)]
NonFinite = Literal["NaN", "Infinity", "-Infinity"]
Num = Union[FiniteFloat, NonFinite]  # noqa: UP007 (the union is built at runtime)
# Every integer is stored in a 64-bit column: a larger one is refused here, with its
# field named, rather than by the database (where it would look like a store fault).
INT64_MAX = 2**63 - 1
Count = Annotated[int, Strict(), Field(ge=0, le=INT64_MAX)]
Int = Annotated[int, Strict(), Field(ge=-INT64_MAX - 1, le=INT64_MAX)]
Name = Annotated[str, Strict(), Field(max_length=m.MAX_NAME_CHARS)]
Text = Annotated[str, Strict(), Field(max_length=16_384)]
NumberList = Annotated[list[Num], Field(max_length=m.MAX_TIMESTEPS)]


class _Open(BaseModel):
    """Known fields are checked; unknown ones are kept as they came."""

    model_config = ConfigDict(extra="allow", strict=True)


class PackedSeries(BaseModel):
    """A series as ``{"f64": "<base64>"}``: little-endian float64 values, base64 encoded.

    The bytes are checked (alphabet, whole float64 values, length) and kept as they
    are: the store writes them as its blob without touching each float, and parsing
    this form costs a tenth of a list of 128 numbers (BENCHMARKS.md, "Ingest").
    """

    # Decoded by pydantic-core while parsing; both base64 alphabets, padding optional.
    model_config = ConfigDict(
        extra="forbid", strict=True, val_json_bytes="base64", ser_json_bytes="base64"
    )
    f64: Annotated[bytes, Field(max_length=8 * m.MAX_TIMESTEPS)]

    @field_validator("f64")
    @classmethod
    def _whole_values(cls, value: bytes) -> bytes:
        if len(value) % 8:
            raise ValueError(
                f"expected whole float64 values (a multiple of 8 bytes), got {len(value)} bytes"
            )
        return value

    def __len__(self) -> int:
        return len(self.f64) // 8


Series = Union[NumberList, PackedSeries]  # noqa: UP007 (the union is built at runtime)


class ModuleInfo(_Open):
    name: Name
    type: Name


class ModelInfo(_Open):
    modules: Annotated[list[ModuleInfo], Field(max_length=100_000)] = []
    parameters: Count | None = None
    recurrent: Annotated[list[Name], Field(max_length=10_000)] = []


class Hello(_Open):
    type: Literal["hello"]
    protocol: Int
    run_id: Annotated[str, Strict(), Field(min_length=1, max_length=m.MAX_NAME_CHARS)]
    run: Name = ""
    rank: Count = 0
    world_size: Annotated[int, Strict(), Field(ge=1, le=INT64_MAX)] = 1
    host: Name = ""
    pid: Count | None = None
    model: ModelInfo = ModelInfo()
    config: dict[str, Any] = {}
    # One per trainer process (optional): seq restarts at 0 in a new process of the same
    # run and rank, so the server deduplicates on (run_id, rank, session, seq).
    session: Name = ""


class ProfileEntry(_Open):
    forward_s: Num | None = None
    backward_s: Num | None = None
    calls: Count | None = None


class StepRecord(_Open):
    kind: Literal["step"]
    step: Count
    epoch: Count = 0
    t: Num | None = None
    duration_s: Num | None = None
    loss: Num | None = None
    timesteps: dict[Name, dict[Name, Series]] | None = None
    timestep_layout: dict[Name, Literal[m.TIMESTEP_LAYOUTS]] | None = None  # type: ignore[valid-type]
    backward_passes: Annotated[int, Strict(), Field(ge=1)] | None = None
    param_norms: dict[Name, Num] | None = None
    gate_norms: dict[Name, dict[Name, Num]] | None = None
    total_norm: Num | None = None
    nonfinite: dict[str, Any] | None = None
    graph_nodes: Count | None = None
    graph_truncated: bool | None = None
    rss_bytes: Count | None = None
    cuda_allocated_bytes: Count | None = None
    cuda_reserved_bytes: Count | None = None
    overhead: Num | None = None
    profile: dict[Name, ProfileEntry] | None = None
    # Gradient flow through depth (issue 19): stored as columns like timesteps and
    # param_norms (store/split.py), no longer as a record's notes.
    depth: dict[Name, Series] | None = None
    update_ratios: dict[Name, Num] | None = None


class EpochRecord(_Open):
    kind: Literal["epoch"]
    epoch: Count
    step: Count | None = None
    t: Num | None = None
    duration_s: Num | None = None
    steps: Count | None = None


class AlertRecord(_Open):
    kind: Literal["alert"]
    step: Count | None = None
    code: Literal[m.ALERT_CODES]  # type: ignore[valid-type]
    severity: Literal[m.SEVERITIES] = "warning"  # type: ignore[valid-type]
    state: Literal[m.ALERT_STATES] = "raised"  # type: ignore[valid-type]
    subject: Name = ""
    message: Text = ""
    hint: Text = ""
    evidence: dict[str, Any] = {}
    t: Num | None = None
    problem: Name | None = None
    opens_problem: bool | None = None


class EndRecord(_Open):
    kind: Literal["end"]
    status: Literal[m.END_STATUSES]  # type: ignore[valid-type]
    step: Count | None = None
    t: Num | None = None


Record = Annotated[
    Union[StepRecord, EpochRecord, AlertRecord, EndRecord],  # noqa: UP007
    Field(discriminator="kind"),
]


class _Packed(BaseModel):
    model_config = ConfigDict(
        extra="forbid", strict=True, val_json_bytes="base64", ser_json_bytes="base64"
    )


class IntColumn(_Packed):
    """A column of int64 values, ``{"i64": "<base64>"}`` (docs/PROTOCOL.md, ``columns``)."""

    i64: Annotated[bytes, Field(max_length=m.MAX_MESSAGE_BYTES)]


class FloatColumn(_Packed):
    """A column of float64 values, ``{"f64": "<base64>"}``."""

    f64: Annotated[bytes, Field(max_length=m.MAX_MESSAGE_BYTES)]


class NamedColumns(_Packed):
    """A block's named scalars: n rows of ``len(names)`` float64 values."""

    names: Annotated[list[Name], Field(max_length=m.MAX_TIMESTEPS)]
    f64: Annotated[bytes, Field(max_length=m.MAX_MESSAGE_BYTES)]


class TimestepColumns(_Packed):
    """One per-timestep series of a block: n rows of ``len`` float64 values."""

    length: Annotated[int, Strict(), Field(ge=0, le=m.MAX_TIMESTEPS, alias="len")]
    f64: Annotated[bytes, Field(max_length=m.MAX_MESSAGE_BYTES)]


class StepColumns(_Packed):
    """Step records of one shape as columns (docs/PROTOCOL.md, ``columns``); the
    lengths and values are checked by :func:`gradwatch.server.column_checks.check_block`."""

    kind: Literal["step"]
    n: Annotated[int, Strict(), Field(ge=1, le=m.MAX_RECORDS_PER_BATCH)]
    step: IntColumn
    epoch: IntColumn | None = None
    t: FloatColumn | None = None
    duration_s: FloatColumn | None = None
    loss: FloatColumn | None = None
    total_norm: FloatColumn | None = None
    overhead: FloatColumn | None = None
    graph_nodes: IntColumn | None = None
    graph_truncated: IntColumn | None = None
    rss_bytes: IntColumn | None = None
    cuda_allocated_bytes: IntColumn | None = None
    cuda_reserved_bytes: IntColumn | None = None
    named: NamedColumns | None = None
    timesteps: dict[Name, dict[Name, TimestepColumns]] | None = None


class Batch(_Open):
    type: Literal["batch"]
    run_id: Annotated[str, Strict(), Field(min_length=1, max_length=m.MAX_NAME_CHARS)]
    rank: Count
    seq: Count
    records: Annotated[list[Record], Field(max_length=m.MAX_RECORDS_PER_BATCH)]
    columns: Annotated[list[StepColumns], Field(max_length=m.MAX_RECORDS_PER_BATCH)] = []


Message = Annotated[Union[Hello, Batch], Field(discriminator="type")]  # noqa: UP007

_MESSAGE: TypeAdapter[Hello | Batch] = TypeAdapter(Message)
RECORDS: TypeAdapter[list[StepRecord | EpochRecord | AlertRecord | EndRecord]] = TypeAdapter(
    list[Record]
)


class ProtocolError(ValueError):
    """A message the server refuses, with the websocket close code that says why."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _describe(value: Any) -> str:
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


def _format_path(loc: tuple[int | str, ...]) -> str:
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
    path = _format_path(first["loc"])
    got = _describe(first.get("input"))
    where = f"{path}: " if path else ""
    if kind in ("json_invalid", "json_type"):
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f"expected one JSON object, got invalid JSON ({first['msg']})"
        )
    if kind == "union_tag_invalid":
        if not path:
            tag = first.get("ctx", {}).get("tag")
            return ProtocolError(
                m.CLOSE_POLICY, f"type: expected 'hello' or 'batch', got {_describe(tag)}"
            )
        tag = first.get("ctx", {}).get("tag")
        return ProtocolError(
            m.CLOSE_INVALID_DATA, f"{path}.kind: expected {_KINDS}, got {_describe(tag)}"
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


def validate(text: str | bytes) -> Hello | Batch:
    """Validate one wire message with pydantic; ValidationError as it comes."""
    return _MESSAGE.validate_json(text)


def parse_message(text: str | bytes) -> Hello | Batch:
    """Validate one wire message; raise :class:`ProtocolError` with a close code and reason."""
    try:
        message = validate(text)
    except ValidationError as error:
        raise describe_error(error) from None
    return check_columns(message)


def check_columns(message: Hello | Batch) -> Hello | Batch:
    """The checks of a batch's ``columns`` that pydantic cannot make (server/column_checks.py)."""
    if isinstance(message, Batch) and message.columns:
        problem = check_batch(message)
        if problem is not None:
            raise ProtocolError(m.CLOSE_INVALID_DATA, problem)
    return message
