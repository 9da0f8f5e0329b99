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
from .schema_errors import ProtocolError, describe_error

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
