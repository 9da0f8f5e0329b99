"""/ws/live sends a batch's step records in step order.

A trainer's sender puts the step records a `columns` block cannot hold (a heavy step's)
in `records` and the others in blocks (docs/PROTOCOL.md); the live message used to list
`records` first, so a heavy step reached viewers before the light steps just before it
(steps 3, 2, 4, 5), and the dashboard dropped those as older than the last one drawn.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gradwatch.protocol.columns import to_columns
from gradwatch.trainer_hooks import watch


def _step_order(message: dict[str, Any]) -> list[int]:
    return [r["step"] for r in message["records"] if r["kind"] == "step"]


def test_a_batch_of_records_and_columns_reaches_viewers_in_step_order(gradwatch_server, wire):
    server = gradwatch_server()
    run_id = wire.run_id()
    light = [wire.step(s) for s in (2, 4, 5)]
    for record in light:  # what a block holds: scalars only
        for key in ("timesteps", "param_norms", "gate_norms", "total_norm", "graph_nodes"):
            record.pop(key)
    heavy = wire.step(3, nonfinite={"parameters": ["lstm1.weight_0"]}, loss="NaN")
    sent = [light[0], heavy, light[1], light[2]]
    rest, blocks = to_columns(sent)
    assert [r["step"] for r in rest] == [3] and blocks, "the sender's split, as on the wire"
    batch = {**wire.batch(run_id, 0, rest), "columns": blocks}
    alert = {"kind": "alert", "step": 3, "code": "nonfinite", "severity": "error",
             "state": "raised", "subject": "loss", "message": "loss is NaN", "t": 1.0}  # fmt: skip
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer)["type"] == "subscribed"
        with wire.connect(server) as trainer:
            trainer.send(json.dumps(wire.hello(run_id)))
            trainer.send(json.dumps(batch))
            assert wire.recv(trainer) == {"type": "ack", "seq": 0, "live": True}
            trainer.send(json.dumps(wire.batch(run_id, 1, [wire.step(6), alert, wire.step(7)])))
            assert wire.recv(trainer) == {"type": "ack", "seq": 1, "live": True}
        mixed = wire.recv(viewer)
        in_order = wire.recv(viewer)
    assert _step_order(mixed) == [2, 3, 4, 5]
    by_step = {r["step"]: r for r in mixed["records"]}
    assert by_step[3]["loss"] == "NaN" and by_step[3]["nonfinite"] == heavy["nonfinite"]
    assert by_step[4]["loss"] == light[1]["loss"]
    # a message in order already is passed on as stored, its alert where it was
    assert [r["kind"] for r in in_order["records"]] == ["step", "alert", "step"]
    assert _step_order(in_order) == [6, 7]


class _TinyLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 8, batch_first=True)
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _train(server: str, run_id: str, spool: Path, steps: int, errors: list[BaseException]) -> None:
    try:
        torch.manual_seed(0)
        model = _TinyLSTM()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        # every=3: heavy steps among light ones in every batch the sender makes
        with watch(model, run="order", server=server, run_id=run_id, every=3, quiet=True,
                   spool=spool) as monitor:  # fmt: skip
            for _ in range(steps):
                x, y = torch.randn(4, 6, 3), torch.randn(4, 1)
                loss = nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                monitor.step(loss)
    except BaseException as error:  # the test's thread reports it
        errors.append(error)


def test_a_real_trainers_heavy_and_light_steps_reach_viewers_in_step_order(
    gradwatch_server, wire, tmp_path
):
    server = gradwatch_server()
    run_id = wire.run_id()
    steps = 300
    errors: list[BaseException] = []
    messages = []
    with wire.connect(server, f"/ws/live?run={run_id}") as viewer:
        assert wire.recv(viewer)["type"] == "subscribed"
        trainer = threading.Thread(
            target=_train, args=(server.url, run_id, tmp_path / "s.jsonl", steps, errors)
        )
        trainer.start()
        try:
            while not any(r["kind"] == "end" for m in messages for r in m.get("records", [])):
                messages.append(wire.recv(viewer, timeout=120))
        finally:
            trainer.join(timeout=120)
    assert not errors, errors
    orders = [_step_order(m) for m in messages if m["type"] == "records"]
    assert sorted(s for order in orders for s in order) == list(range(steps))
    mixed = [
        m for m in messages if m["type"] == "records"
        and len({"timesteps" in r for r in m["records"] if r["kind"] == "step"}) == 2
    ]  # fmt: skip
    assert mixed, "no batch held heavy and light steps together: nothing was tested"
    assert [o for o in orders if o != sorted(o)] == []
