"""profile=True notices work a loop recomputes from the same tensor; hotspot names it.

The profiler's forward pre-hook notes which tensor arguments a module got on every
call of a step (the same object, unchanged). The tutorial's Bahdanau decoder projects
the encoder outputs with ``Ua(keys)`` inside its per-token loop: the same input on all
10 calls, so ``hotspot``'s fix names ``decoder.attention.Ua`` and ``Ua(keys)``. Its
twin computes that projection once before the loop; what the loop's modules get then
changes from call to call, and the fix names nothing to hoist.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwatch.protocol import read_spool
from gradwatch.trainer_hooks import watch
from gradwatch.trainer_hooks.quantities.profile import ModuleProfile

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _runs() -> Any:
    spec = importlib.util.spec_from_file_location("diagnosis_runs", BENCH / "diagnosis_runs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("diagnosis_runs", module)
    spec.loader.exec_module(module)
    return module


runs = _runs()


def same_input(model: nn.Module, forward: Any) -> dict[str, Any]:
    """One profiled step of ``forward()`` (then backward); the ``same_input`` it found."""
    q = ModuleProfile()
    q.attach(model)
    try:
        q.start_step(True)
        forward().sum().backward()
        return dict(q.finish_step(None).get("same_input", {}))
    finally:
        q.detach()


class Loop(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.step = nn.Linear(4, 4)
        self.act = nn.Tanh()

    def forward(self, memory: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(2, 4)
        for t in range(x.shape[1]):
            # proj: the same tensor every call; act: a view made and dropped per call
            # (its id is free for the next one); step: a new input every call
            h = self.step(h + self.act(x[:, t])) + self.proj(memory).mean(1)
        return h


def test_a_module_fed_the_same_tensor_on_every_call_is_listed_with_who_passed_it() -> None:
    torch.manual_seed(0)
    model = Loop()
    found = same_input(model, lambda: model(torch.randn(2, 3, 4), torch.randn(2, 6, 4)))
    assert found == {
        "proj": {"args": ["input"], "of": 1, "calls": 6, "from": {"input": "Loop:memory"}}
    }


def test_a_new_view_that_reuses_a_freed_ones_id_is_not_the_same_tensor() -> None:
    # x[:, t] is made and dropped per call: CPython hands the next view the same id (and
    # it shares x's version counter and shape). Only the weak reference tells them apart.
    act = nn.Tanh()
    x = torch.randn(2, 6, 4)
    ids: list[int] = []
    act.register_forward_pre_hook(lambda module, args: ids.append(id(args[0])))

    def forward() -> torch.Tensor:
        h = torch.zeros(2, 4, requires_grad=True)
        for t in range(6):
            v = x[:, t]
            h = h + act(v)
            del v
        return h

    assert same_input(act, forward) == {}
    assert len(set(ids)) < len(ids)  # the trap was there: an id came back


def test_a_tensor_changed_in_place_or_weights_changed_between_calls_are_not_the_same() -> None:
    torch.manual_seed(0)
    lin, act = nn.Linear(4, 4), nn.Tanh()
    memory = torch.randn(4, 4)

    def in_place() -> torch.Tensor:
        out = act(lin.weight + memory)
        memory.mul_(2.0)  # the same object, new contents: its version counter moved
        return out + act(lin.weight + memory)

    def in_place_twin() -> torch.Tensor:
        x = lin.weight + memory
        return act(x) + act(x)

    def new_weights() -> torch.Tensor:
        out = lin(memory)
        with torch.no_grad():
            lin.weight.add_(1.0)
        return out + lin(memory)

    def same() -> torch.Tensor:
        return lin(memory) + lin(memory)

    assert same_input(act, in_place) == {}
    assert same_input(act, in_place_twin)["Tanh"]["args"] == ["input"]
    assert same_input(lin, new_weights) == {}
    assert same_input(lin, same)["Linear"]["args"] == ["input"]


def alerts_and_steps(
    tmp_path: Path, model: nn.Module
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    spool = tmp_path / "s2s.jsonl"
    with watch(model, run="s2s", every=1, spool=spool, profile=True) as monitor:
        for _ in range(4):
            src = torch.randint(1, 12, (8, 10))
            out = model(src, src.flip(1))
            loss = nn.functional.cross_entropy(out.reshape(-1, 12), src.flip(1).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            monitor.step(loss)
    records = [r for m in read_spool(spool) if m["type"] == "batch" for r in m["records"]]
    return (
        [r for r in records if r["kind"] == "alert" and r["code"] == "hotspot"],
        [r for r in records if r["kind"] == "step"],
    )


def test_hotspot_names_the_key_projection_the_bahdanau_loop_recomputes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    alerts, steps = alerts_and_steps(tmp_path, runs.Seq2Seq())
    assert all(
        s["same_input"]["decoder.attention.Ua"]["from"] == {"input": "decoder.attention:keys"}
        for s in steps
    )
    (alert,) = [a for a in alerts if a["state"] == "raised"]
    hoist = alert["evidence"]["hoist"]
    assert (alert["subject"], hoist["module"], hoist["calls"]) == (
        "decoder",
        "decoder.attention.Ua",
        10,
    )
    assert hoist["expression"] == "Ua(keys)"
    assert (
        "decoder.attention.Ua was given the very same tensor decoder.attention's `keys`"
        in alert["hint"]
    )
    assert "compute Ua(keys) once before the loop" in alert["hint"]


class HoistedAttention(runs.BahdanauAttention):  # type: ignore[misc,name-defined]
    def forward(
        self, query: torch.Tensor, keys: torch.Tensor, projected: torch.Tensor
    ) -> torch.Tensor:
        scores = self.Va(torch.tanh(self.Wa(query) + projected)).squeeze(2).unsqueeze(1)
        return torch.bmm(torch.softmax(scores, dim=-1), keys)


class HoistedDecoder(runs.AttnDecoder):  # type: ignore[misc,name-defined]
    """The fix applied: Ua(keys) once before the loop."""

    def __init__(self, vocab: int, hidden: int, target_len: int) -> None:
        super().__init__(vocab, hidden, target_len)
        self.attention = HoistedAttention(hidden)

    def forward(self, keys: torch.Tensor, h: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        projected = self.attention.Ua(keys)
        token = torch.zeros(tgt.shape[0], 1, dtype=torch.long)
        outs = []
        for i in range(self.target_len):
            context = self.attention(h.permute(1, 0, 2), keys, projected)
            out, h = self.gru(torch.cat((self.embedding(token), context), dim=2), h)
            outs.append(self.out(out))
            token = tgt[:, i].unsqueeze(1)
        return torch.cat(outs, 1)


def test_a_loop_whose_modules_get_new_inputs_every_call_gets_no_hoist_advice(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    model = runs.Seq2Seq()
    model.decoder = HoistedDecoder(12, 16, 10)
    alerts, steps = alerts_and_steps(tmp_path, model)
    # attention still gets the same keys and projection, but its query changes: not hoistable
    assert steps[0]["same_input"]["decoder.attention"]["args"] == ["keys", "projected"]
    assert steps[0]["same_input"]["decoder.attention"]["of"] == 3
    assert "decoder.attention.Ua" not in steps[0]["same_input"]  # called once now
    raised = [a for a in alerts if a["state"] == "raised"]
    assert raised and all("hoist" not in a["evidence"] for a in raised)
    assert all("First move" not in a["hint"] and "Batch what is left" in a["hint"] for a in raised)
