"""The names of gradwatch's wire protocol, version 1.

This module is the one definition that the trainer, the server, the database and
the browser share. It imports nothing beyond the standard library, so both the
training process (torch, no fastapi) and the server (fastapi, no torch) can use it.

The names here are a contract: extend them, never rename them. docs/PROTOCOL.md
explains every field.

Example:
    >>> from gradwatch.protocol import messages as m
    >>> m.PROTOCOL_VERSION
    1
    >>> "vanishing" in m.ALERT_CODES
    True
"""

from __future__ import annotations

from typing import Any, Final, Literal, NotRequired, TypedDict

PROTOCOL_VERSION: Final = 1

# Message types (the top-level "type" field).
HELLO: Final = "hello"
BATCH: Final = "batch"
ACK: Final = "ack"
ERROR: Final = "error"
MESSAGE_TYPES: Final = (HELLO, BATCH, ACK, ERROR)

# Record kinds (the "kind" field of each entry in a batch's "records").
STEP: Final = "step"
EPOCH: Final = "epoch"
ALERT: Final = "alert"
END: Final = "end"
RECORD_KINDS: Final = (STEP, EPOCH, ALERT, END)

# Alert codes, severities and life cycle.
ALERT_CODES: Final = (
    "vanishing",
    "exploding",
    "nonfinite",
    "graph_growth",
    "slowdown",
    "hotspot",
    "no_gradient",
    "spike",
)
SEVERITIES: Final = ("info", "warning", "error")
ALERT_STATES: Final = ("raised", "updated", "cleared")
END_STATUSES: Final = ("finished", "crashed")

# Per-timestep series of one recurrent module: "input" for fused layers (dL/dx_t),
# "hidden"/"cell" for cells called in a loop (dL/dh_k, dL/dc_k). Stacked fused
# layers add "layer<i>" series (dL/d(output of layer i-1) for layer i > 0).
TIMESTEP_SERIES: Final = ("input", "hidden", "cell")

# How a cell's calls within a step connect (step field `timestep_layout`): "chain" when
# every call k > 0 was fed call k-1's output state, "tree" otherwise. Absent: chain.
TIMESTEP_LAYOUTS: Final = ("chain", "tree")

# Step fields of gradient flow through depth (issue 19): the depth series per stack of
# blocks and the optimizer's update-to-weight ratios. Not column fields: a step record
# carrying them travels in a batch's `records` (docs/PROTOCOL.md, `columns`).
DEPTH: Final = "depth"
UPDATE_RATIOS: Final = "update_ratios"

# Gate names per parameter family, in PyTorch's packing order of weight_ih/weight_hh.
LSTM_GATES: Final = ("i", "f", "g", "o")
GRU_GATES: Final = ("r", "z", "n")

# Limits the server enforces (and the sender respects).
MAX_MESSAGE_BYTES: Final = 4 * 1024 * 1024
MAX_RECORDS_PER_BATCH: Final = 10_000
MAX_NAME_CHARS: Final = 256
MAX_TIMESTEPS: Final = 100_000

# JSON has no NaN or infinity. Non-finite numbers travel as these strings wherever a
# number is expected; every reader (server, browser, spool import) maps them back.
NONFINITE_STRINGS: Final = {
    "NaN": float("nan"),
    "Infinity": float("inf"),
    "-Infinity": float("-inf"),
}

# WebSocket close codes used by the server (RFC 6455).
CLOSE_INVALID_DATA: Final = 1007  # not JSON, wrong types, bad values
CLOSE_POLICY: Final = 1008  # auth, origin, protocol version, unknown type
CLOSE_TOO_BIG: Final = 1009  # over MAX_MESSAGE_BYTES

Number = float | int | str  # str only for the NONFINITE_STRINGS


class ModuleInfo(TypedDict):
    name: str
    type: str


class ModelInfo(TypedDict, total=False):
    modules: list[ModuleInfo]
    parameters: int
    recurrent: list[str]


class Hello(TypedDict):
    type: Literal["hello"]
    protocol: int
    run_id: str
    run: str
    rank: int
    world_size: int
    host: str
    pid: int
    model: ModelInfo
    config: dict[str, Any]


class Batch(TypedDict):
    type: Literal["batch"]
    run_id: str
    rank: int
    seq: int
    records: list[dict[str, Any]]


class Ack(TypedDict):
    type: Literal["ack"]
    seq: int
    #: what the server left out of the batch it stored (a bad field), when anything
    notice: NotRequired[str]
    #: whether anyone watches the run live now (the trainer paces its hand-over by it)
    live: NotRequired[bool]


class Error(TypedDict):
    type: Literal["error"]
    code: int
    message: str
    #: the batch the database refused or failed to store, when it was one batch
    seq: NotRequired[int]


class StepRecord(TypedDict, total=False):
    kind: Literal["step"]
    step: int
    epoch: int
    t: float
    duration_s: float
    loss: Number | None
    timesteps: dict[str, dict[str, list[Number]]]
    timestep_layout: dict[str, Literal["chain", "tree"]]
    backward_passes: int
    param_norms: dict[str, Number]
    gate_norms: dict[str, dict[str, Number]]
    total_norm: Number
    nonfinite: dict[str, Any]
    graph_nodes: int
    graph_truncated: bool
    rss_bytes: int
    cuda_allocated_bytes: int
    cuda_reserved_bytes: int
    overhead: float
    profile: dict[str, dict[str, float]]
    same_input: dict[str, dict[str, Any]]
    # ||dL/dx_l|| at the input of block l of each stack of blocks, l in order
    depth: dict[str, list[Number]]
    # ||w_after - w_before|| / ||w_before|| of the optimizer step just taken, per parameter
    update_ratios: dict[str, Number]
    # only with sharded (FSDP2) parameters: "global" (norms all-reduced over the
    # shards) or "local" (each rank's shard norms)
    norm_scope: Literal["global", "local"]
    global_total_norm: Number


class EpochRecord(TypedDict, total=False):
    kind: Literal["epoch"]
    epoch: int
    step: int
    t: float
    duration_s: float
    steps: int


class AlertRecord(TypedDict, total=False):
    kind: Literal["alert"]
    step: int
    code: str
    severity: str
    state: str
    subject: str
    message: str
    hint: str
    evidence: dict[str, Any]
    t: float
    problem: str
    opens_problem: bool


class EndRecord(TypedDict, total=False):
    kind: Literal["end"]
    status: str
    step: int
    t: float
