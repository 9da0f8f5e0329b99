"""Issue #7 in the browser: the ranks of a distributed run side by side, and the spread
between them, in headless Chromium against a real gradwatch server.

The first test streams two ranks of one run through the wire protocol with known
numbers (exact spreads); the second runs two real watch() trainers, one process per
rank (RANK/WORLD_SIZE and a shared GRADWATCH_RUN_ID, as torchrun sets them), with
rank 1 a straggler.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from .conftest import assert_clean, chart, scroll_to, step_record, wait_js

pytestmark = pytest.mark.browser

SPREAD = "chart-ranks-spread"


def ranked_step(step: int, *, slow: float = 1.0, norm: float = 1.0) -> dict[str, Any]:
    """A step record whose step time and total norm are scaled (a straggler, a divergence)."""
    rec = step_record(step)
    rec["duration_s"] = 0.01 * slow
    rec["total_norm"] = 0.5 * norm
    rec["loss"] = 1.0 / (1 + step) * norm
    return rec


def spread_series(page: Any) -> dict[str, Any]:
    return chart(page, SPREAD, "Object.fromEntries(d.data.map(t => [t.name, [t.x, t.y]]))")


def test_two_ranks_show_side_by_side_with_their_spread_from_history_and_live(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    r0 = raw_trainer(server, "ddp-2", rank=0, world_size=2)
    r1 = raw_trainer(server, "ddp-2", run_id=r0.run_id, rank=1, world_size=2)
    r0.send([ranked_step(s) for s in range(5)])
    r1.send([ranked_step(s, slow=3.0, norm=2.0) for s in range(5)])

    # The runs list counts the ranks of the run.
    w = open_page(server)
    row = f"tr[data-run-id='{r0.run_id}']"
    w.page.wait_for_selector(row)
    assert w.page.inner_text(f"{row} [data-field=ranks]") == "2"
    w.page.click(f"{row} a.run-link")
    w.page.wait_for_selector("body[data-painted='1'] #ranks-grid")

    # History: one trace per rank, one colour each, legend "rank 0", "rank 1".
    for chart_id in ("chart-ranks-time", "chart-ranks-norm", "chart-ranks-loss"):
        scroll_to(w.page, chart_id)
        assert chart(w.page, chart_id, "d.data.map(t => t.name)") == ["rank 0", "rank 1"]
        assert chart(w.page, chart_id, "d.data.map(t => t.x.length)") == [5, 5]
        colours = chart(w.page, chart_id, "d.data.map(t => t.line.color)")
        assert colours[0] != colours[1]
    assert chart(w.page, "chart-ranks-time", "d.data.map(t => t.y[0])") == pytest.approx([10, 30])
    # The spread: max/min per step; rank 1 takes 3x as long and has 2x the norm.
    scroll_to(w.page, SPREAD)
    spread = spread_series(w.page)
    assert spread["step time max/min"][0] == [0, 1, 2, 3, 4]
    assert spread["step time max/min"][1] == pytest.approx([3.0] * 5)
    assert spread["total norm max/min"][1] == pytest.approx([2.0] * 5)
    note = w.page.inner_text("#panel-ranks-spread header .note")
    assert "step 4" in note and "rank 1 slowest" in note and "rank 1 largest" in note

    # Live: rank 0 runs ahead, so its steps wait for rank 1's before they have a spread;
    # rank 1's norm is NaN at step 7 (a gap in the norm spread, not a number); then
    # rank 1 straggles 10x at step 9 and its norm falls to half of rank 0's.
    r0.send([ranked_step(s) for s in range(5, 10)])
    late = [ranked_step(s, slow=3.0, norm=2.0) for s in range(5, 9)]
    late[2]["total_norm"] = "NaN"
    r1.send(late)
    r1.send([ranked_step(9, slow=10.0, norm=0.5)])
    wait_js(w.page, f"() => document.getElementById('{SPREAD}').data[0].x.length === 10")
    spread = spread_series(w.page)
    assert spread["step time max/min"][0] == list(range(10))
    assert spread["step time max/min"][1][-1] == pytest.approx(10.0)
    assert spread["total norm max/min"][1][-1] == pytest.approx(2.0)
    assert spread["total norm max/min"][1][7] is None
    assert spread["step time max/min"][1][7] == pytest.approx(3.0)
    wait_js(w.page, "() => document.querySelector('#panel-ranks-spread .note')"
                    ".textContent.startsWith('step 9')")  # fmt: skip
    note = w.page.inner_text("#panel-ranks-spread header .note")
    assert "10.00× (rank 1 slowest)" in note and "2.00× (rank 0 largest)" in note
    scroll_to(w.page, "chart-ranks-time")
    wait_js(w.page, "() => document.getElementById('chart-ranks-time').data"
                    ".every(t => t.x.length === 10)")  # fmt: skip
    assert chart(w.page, "chart-ranks-time", "d.data[1].y[9]") == pytest.approx(100)
    stats = w.page.evaluate("() => window.gradwatch.stats")
    assert stats["extendCalls"] > 0 and stats["flushes"] <= stats["records"]
    # This rank's own charts stay this rank's: the norm chart holds rank 0's total norm.
    scroll_to(w.page, "chart-norms")
    assert chart(w.page, "chart-norms", "d.data[0].y.slice(-1)") == pytest.approx([0.5])
    w.page.locator("#panel-ranks-spread").scroll_into_view_if_needed()
    w.screenshot("ranks-side-by-side")

    # The heatmap and profile stay per rank: the selector opens rank 1 (old route).
    w.page.select_option(".toolbar select", "1")
    wait_js(w.page, f"() => location.hash === '#/run/{r0.run_id}/1'")
    w.page.wait_for_selector("body[data-painted='1'] #chart-heatmap-lstm-input")
    asked = [u for u in w.requests if "/timesteps" in u and "rank=1" in u]
    assert asked, w.requests
    scroll_to(w.page, "chart-heatmap-lstm-input")  # below the ranks: drawn when seen
    assert chart(w.page, "chart-heatmap-lstm-input", "d.data[0].z.length") == 10

    # A run of one rank has no side-by-side section.
    single = raw_trainer(server, "single")
    single.send([step_record(0)])
    w.page.evaluate(f"() => {{ location.hash = '#/run/{single.run_id}'; }}")
    wait_js(w.page, "() => document.getElementById('run-name')?.textContent === 'single'"
                    " && document.body.dataset.painted === '1'")  # fmt: skip
    assert w.page.locator("#ranks-grid").count() == 0
    assert_clean(w)


def test_a_rank_that_joins_while_the_page_is_open_shows_side_by_side(
    gradwatch_server, open_page, raw_trainer
):
    server = gradwatch_server()
    r0 = raw_trainer(server, "late-rank", rank=0, world_size=2)
    r0.send([ranked_step(s) for s in range(3)])
    w = open_page(server, f"#/run/{r0.run_id}")
    w.page.wait_for_selector("body[data-painted='1'] #run-name")
    assert w.page.locator("#ranks-grid").count() == 0  # one rank so far: the plain view
    r1 = raw_trainer(server, "late-rank", run_id=r0.run_id, rank=1, world_size=2)
    r1.send([ranked_step(s, slow=4.0) for s in range(3)])
    w.page.wait_for_selector("body[data-painted='1'] #ranks-grid")
    scroll_to(w.page, SPREAD)
    wait_js(w.page, f"() => document.getElementById('{SPREAD}').data[0].x.length === 3")
    assert spread_series(w.page)["step time max/min"][1] == pytest.approx([4.0] * 3)
    r0.send([ranked_step(3)])
    r1.send([ranked_step(3, slow=4.0)])
    wait_js(w.page, f"() => document.getElementById('{SPREAD}').data[0].x.length === 4")
    assert w.page.inner_text("#crumbs").endswith("late-rank")
    assert_clean(w)


def test_spread_of_a_downsampled_history_is_binned_across_ranks(
    gradwatch_server, open_page, raw_trainer
):
    # 2,100 steps per rank: over the 2,000 points the run view asks for, so the server
    # keeps each bucket's min and max, at steps that differ between the ranks; the
    # spread must still be there (regression: it was empty when no step lined up).
    server = gradwatch_server()
    r0 = raw_trainer(server, "long-ddp", rank=0, world_size=2)
    r1 = raw_trainer(server, "long-ddp", run_id=r0.run_id, rank=1, world_size=2)
    light = ("timesteps", "param_norms", "gate_norms")
    for trainer, slow, shift in ((r0, 1.0, 0), (r1, 2.0, 1)):
        for start in range(0, 2100, 700):
            # a wiggle out of phase between the ranks: their buckets' min/max steps differ
            wiggle = [slow + 0.01 * ((s + shift) % 3) for s in range(start, start + 700)]
            records = [ranked_step(start + i, slow=x) for i, x in enumerate(wiggle)]
            for rec in records:
                for key in light:
                    del rec[key]
            trainer.send(records)
    w = open_page(server, f"#/run/{r0.run_id}")
    w.page.wait_for_selector("body[data-painted='1'] #ranks-grid")
    scroll_to(w.page, SPREAD)
    wait_js(w.page, f"() => document.getElementById('{SPREAD}').data[0].x.length > 0")
    steps, values = spread_series(w.page)["step time max/min"]
    assert 500 <= len(steps) <= 1001, len(steps)
    assert steps == sorted(steps) and steps[0] == 0
    # Rank 1 is about twice as slow in every bin (the +1 % wiggle averages out).
    assert all(1.9 < v < 2.1 for v in values), values
    caption = w.page.inner_text("#panel-ranks-spread .caption")
    assert "bins of 3 steps" in caption, caption
    assert "rank 1 slowest" in w.page.inner_text("#panel-ranks-spread header .note")
    assert_clean(w)


WORKER = textwrap.dedent(
    """
    import sys
    import time
    import torch
    from torch import nn
    from gradwatch.trainer_hooks import watch

    rank = int(sys.argv[2])
    torch.manual_seed(rank)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch(model, run="two-ranks", server=sys.argv[1], every=1, diagnose=False) as monitor:
        for step in range(int(sys.argv[3]) + int(sys.argv[4])):
            if step == int(sys.argv[3]):
                print("ready", flush=True)
                sys.stdin.readline()  # the test opens the page, then says go
            x = torch.randn(16, 4)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if rank == 1:
                time.sleep(0.3)  # the straggler of the scenario, not synchronisation
            monitor.step(loss)
    """
)

BEFORE = 3  # steps each rank trains before the page is open
AFTER = 5  # steps each rank trains while the page watches


@pytest.mark.slow
def test_two_real_ranks_stream_side_by_side_and_the_straggler_shows_in_the_spread(
    tmp_path: Path, gradwatch_server, open_page
):
    server = gradwatch_server()
    script = tmp_path / "rank.py"
    script.write_text(WORKER)
    run_id = str(uuid.uuid4())
    procs: list[subprocess.Popen[str]] = []
    files = contextlib.ExitStack()
    logs = [tmp_path / f"rank{rank}.log" for rank in (0, 1)]
    for rank in (0, 1):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "GRADWATCH_RUN_ID": run_id,
               "OMP_NUM_THREADS": "1"}  # fmt: skip
        procs.append(subprocess.Popen(
            [sys.executable, "-W", "ignore", str(script), server.url, str(rank), str(BEFORE),
             str(AFTER)],
            env=env, cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=files.enter_context(logs[rank].open("w")), text=True,
        ))  # fmt: skip
    try:
        for p, log in zip(procs, logs, strict=True):
            assert p.stdout is not None
            assert p.stdout.readline().strip() == "ready", log.read_text()[-3000:]
        w = open_page(server)
        row = f"tr[data-run-id='{run_id}']"
        # Both ranks said hello: the live runs list counts 2.
        wait_js(w.page, f"() => document.querySelector(\"{row} [data-field=ranks]\")"
                        "?.textContent === '2'", 60)  # fmt: skip
        w.page.click(f"{row} a.run-link")
        w.page.wait_for_selector("body[data-painted='1'] #ranks-grid")
        scroll_to(w.page, SPREAD)
        at_paint = chart(w.page, SPREAD, "d.data[0].x.length")
        assert at_paint <= BEFORE

        for p in procs:  # go: the rest of training streams while the page watches
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.close()
        total = BEFORE + AFTER
        wait_js(w.page, f"() => document.getElementById('{SPREAD}').data[0].x.length === {total}",
                90)  # fmt: skip
        for p, log in zip(procs, logs, strict=True):
            assert p.wait(timeout=60) == 0, log.read_text()[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for pipe in (p.stdin, p.stdout):
                if pipe is not None:
                    pipe.close()
        files.close()

    assert chart(w.page, SPREAD, "d.data[0].x") == list(range(total))
    scroll_to(w.page, "chart-ranks-time")
    wait_js(w.page, f"() => document.getElementById('chart-ranks-time').data"
                    f".every(t => t.x.length === {total})")  # fmt: skip
    assert chart(w.page, "chart-ranks-time", "d.data.map(t => t.name)") == ["rank 0", "rank 1"]
    # Rank 1 sleeps 0.3 s a step: it is the slowest at the last step, by a wide margin.
    slow = chart(w.page, SPREAD, "d.data.find(t => t.name === 'step time max/min').y")
    assert slow[-1] > 2, slow
    note = w.page.inner_text("#panel-ranks-spread header .note")
    assert f"step {total - 1}" in note and "(rank 1 slowest)" in note, note
    # Each rank's own gradients: the norms differ between the ranks.
    norms = chart(w.page, "chart-ranks-norm", "d.data.map(t => t.y[t.y.length - 1])")
    assert norms[0] != norms[1]
    w.page.locator("#panel-ranks-spread").scroll_into_view_if_needed()
    w.screenshot("ranks-real-straggler")
    assert_clean(w)
