"""One host copy per step: the payload comes back with every leaf's shape, dtype, value."""

from __future__ import annotations

import torch

from gradwatch.trainer_hooks.transfer import pack


def test_a_payload_round_trips_with_shapes_dtypes_and_plain_parts() -> None:
    norms = torch.tensor([1e-29, 3.0, 1e300], dtype=torch.float64)
    slots = [0, 2, 5]
    payload = {
        "param_norms": {"norms": [norms], "slots": [slots], "gated": [[(1, 4)]]},
        "timesteps": {"cell": {"hidden": torch.rand(24, dtype=torch.float32)}},
        "count": torch.tensor(2**40 + 1),  # int64 above float32's exact range
        "pair": (torch.ones(2, 3, dtype=torch.float16), "text"),
        "graph_nodes": 466,
    }
    packed = pack(payload)
    norms.mul_(0)  # the copy is taken at pack time: later writes do not reach it
    out = packed.unpack()
    assert torch.equal(out["param_norms"]["norms"][0],
                       torch.tensor([1e-29, 3.0, 1e300], dtype=torch.float64))
    assert out["param_norms"]["slots"] == [[0, 2, 5]]
    assert out["param_norms"]["gated"] == [[(1, 4)]]
    hidden, sent = out["timesteps"]["cell"]["hidden"], payload["timesteps"]["cell"]["hidden"]
    assert hidden.dtype == torch.float32 and torch.equal(hidden, sent)
    assert out["count"].dtype == torch.int64 and int(out["count"]) == 2**40 + 1
    assert isinstance(out["pair"], tuple) and out["pair"][1] == "text"
    assert out["pair"][0].dtype == torch.float16 and out["pair"][0].shape == (2, 3)
    assert out["graph_nodes"] == 466


def test_a_payload_without_tensors_needs_no_buffer() -> None:
    packed = pack({"graph_nodes": 3, "alerts": [{"code": "x"}]})
    assert packed.buffers == []
    assert packed.unpack() == {"graph_nodes": 3, "alerts": [{"code": "x"}]}


def test_a_leaf_after_plain_values_or_in_a_dict_subclass_is_found() -> None:
    """The walk passes over plain values without looking into them: a tensor after
    them in a list, or in an OrderedDict, still travels (and is copied)."""
    from collections import OrderedDict

    late = torch.tensor([2.5, -1.0], dtype=torch.float64)
    ordered = OrderedDict(a=1, b=torch.tensor([7.0]))
    payload = {"mixed": [1, 2.0, "s", None, True, late], "ordered": ordered,
               "plain": [0, 1.5, None], "flags": {"x": False, "y": "z"}}
    packed = pack(payload)
    late.zero_()
    out = packed.unpack()
    assert torch.equal(out["mixed"][5], torch.tensor([2.5, -1.0], dtype=torch.float64))
    assert out["mixed"][:5] == [1, 2.0, "s", None, True]
    assert out["ordered"]["a"] == 1 and torch.equal(out["ordered"]["b"], torch.tensor([7.0]))
    assert out["plain"] == [0, 1.5, None] and out["flags"] == {"x": False, "y": "z"}
    assert len(packed.buffers) == 1 and packed.buffers[0].numel() == 3
