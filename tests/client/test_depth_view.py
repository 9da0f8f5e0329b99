"""Gradient flow through depth on the dashboard (issue 19), in headless Chromium.

A tiny GPT (examples/tiny_gpt.py's model, trained here in a thread with watch()) streams
into a real server while the run view is open: the depth heatmap gains a row per step
live, its columns are the blocks by name, and its colours, the latest depth profile and
the update-to-weight ratio chart hold the numbers measured beside gradwatch with plain
autograd (retain_grad on each block's input) and a snapshot around optimizer.step().
A raw trainer then sends 40 blocks with a hostile stack name: names stay text, the
ratio chart shows the top blocks, and its search box finds the others; a block's
`spike` alert takes the reader to the stack's depth heatmap; a replay shows the same.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ..trainer_hooks.precision import F32_RTOL
from .conftest import chart, end_record, scroll_to, step_record, wait_js

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BEFORE_PAGE = 3  # steps trained before the page is open
AFTER_PAGE = 6  # steps trained while it watches
BLOCKS = ["blocks.0", "blocks.1", "blocks.2"]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def tiny_gpt_module() -> Any:
    sys.path.insert(0, str(EXAMPLES))  # the example imports its _scenario helper
    try:
        spec = importlib.util.spec_from_file_location("tiny_gpt_for_test", EXAMPLES / "tiny_gpt.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(EXAMPLES))


def block_ratio(ratios: dict[str, float], block: str) -> float:
    """A block's ratio as the dashboard documents it: its parameters' largest finite one."""
    found = [r for p, r in ratios.items() if p.startswith(block + ".") and math.isfinite(r)]
    return max(found)


def train(server_url: str, page_open: threading.Event, truth: dict[int, Any],
          errors: list[Any]) -> None:
    """Trains the tiny GPT under watch(); per step, what plain autograd says."""
    try:
        import torch
        from torch import nn

        from gradwatch.trainer_hooks import watch

        gpt = tiny_gpt_module()
        torch.manual_seed(0)
        model = gpt.TinyGPT()
        data = gpt.corpus()
        optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        inputs: list[Any] = []

        def keep_input(module: Any, args: tuple[Any, ...]) -> None:
            args[0].retain_grad()  # registered before watch(): the block's own input
            inputs.append(args[0])

        for block in model.blocks:
            block.register_forward_pre_hook(keep_input)
        with watch(model, run="tiny gpt depth", server=server_url, every=1, quiet=True) as monitor:
            for step in range(BEFORE_PAGE + AFTER_PAGE):
                if step == BEFORE_PAGE and not page_open.wait(60):
                    raise TimeoutError("the dashboard did not open within 60 s")
                inputs.clear()
                x, y = gpt.batch(data, 8, poisoned=False)
                loss = nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
                optimizer.zero_grad()
                loss.backward()
                depth = [torch.linalg.vector_norm(t.grad, dtype=torch.float64).item()
                         for t in inputs]
                before = {n: p.detach().clone() for n, p in model.named_parameters()}
                optimizer.step()
                ratios = {
                    n: (torch.linalg.vector_norm(p.detach() - before[n], dtype=torch.float64)
                        / torch.linalg.vector_norm(before[n], dtype=torch.float64)).item()
                    for n, p in model.named_parameters()
                }
                truth[step] = {"depth": depth, "ratios": ratios}
                monitor.step(loss)
    except BaseException as error:  # the test's main thread reports it
        errors.append(error)
        page_open.set()


def test_tiny_gpt_depth_heatmap_profile_and_ratios_match_autograd_live(
    gradwatch_server, open_page
):
    server = gradwatch_server()
    page_open = threading.Event()
    truth: dict[int, Any] = {}
    errors: list[Any] = []
    trainer = threading.Thread(target=train, args=(server.url, page_open, truth, errors),
                               daemon=True)
    trainer.start()
    w = open_page(server)
    w.page.wait_for_selector("#runs-body a.run-link", timeout=60_000)
    w.page.click("#runs-body a.run-link")
    w.page.wait_for_selector("body[data-painted='1']")
    page_open.set()  # the rest of training streams while the page watches
    total = BEFORE_PAGE + AFTER_PAGE
    heat = "chart-heatmap-depth-blocks-input"
    w.page.wait_for_selector(f"#{heat}", timeout=60_000)  # the stack's panel, at load or live
    scroll_to(w.page, heat)
    wait_js(w.page, f"() => document.getElementById('{heat}').data[0].y.length === {total}", 90)
    trainer.join(timeout=60)
    assert not errors, errors
    assert not trainer.is_alive()

    # The heatmap: one row per step, one column per block, named as the model names them.
    assert chart(w.page, heat, "Array.from(d.data[0].y)") == list(range(total))
    assert chart(w.page, heat, "d.layout.xaxis.ticktext") == BLOCKS
    assert w.page.inner_text("#panel-heatmap-depth-blocks-input h2") == (
        "Gradient flow through depth: blocks")
    z = chart(w.page, heat, "d.data[0].z.map((r) => Array.from(r))")
    for step, row in enumerate(z):  # default colour: decades below the step's peak
        depth = truth[step]["depth"]
        assert row == pytest.approx([math.log10(v / max(depth)) for v in depth], abs=1e-9)

    # The latest depth profile: the last step's norms, as autograd has them.
    scroll_to(w.page, "chart-depth-profile")
    latest = f"() => document.getElementById('chart-depth-profile').dataset.step === '{total - 1}'"
    wait_js(w.page, latest)
    profile = chart(w.page, "chart-depth-profile", "Array.from(d.data[0].y)")
    assert profile == pytest.approx(truth[total - 1]["depth"], rel=1e-9)
    assert chart(w.page, "chart-depth-profile", "d.layout.xaxis.ticktext") == BLOCKS
    assert chart(w.page, "chart-depth-profile", "d.layout.yaxis.type") == "log"

    # Update-to-weight ratios per block (log y, the 1e-3 line), history and live alike.
    ratios = "chart-ratios"
    scroll_to(w.page, ratios)
    done = (f"() => (document.getElementById('{ratios}').data || [])"
            f".some((t) => t.x.length === {total})")
    wait_js(w.page, done)
    traces = chart(w.page, ratios, "d.data.map((t) => ({name: t.name, group: t.legendgroup,"
                   " x: Array.from(t.x), y: Array.from(t.y)}))")
    by_name = {t["name"]: t for t in traces}
    assert set(BLOCKS) <= set(by_name)
    assert {by_name[b]["group"] for b in BLOCKS} == {"blocks"}
    for block in BLOCKS:
        trace = by_name[block]
        assert trace["x"] == list(range(total)), block
        expected = [block_ratio(truth[s]["ratios"], block) for s in trace["x"]]
        # float32 weights on CPU: ratios to float32 rounding (trainer_hooks/.../norms.py)
        assert trace["y"] == pytest.approx(expected, rel=F32_RTOL), block
    assert chart(w.page, ratios, "d.layout.yaxis.type") == "log"
    guide = chart(w.page, ratios, "d.layout.shapes[0]")
    assert guide["y0"] == guide["y1"] == -3  # log10(1e-3) on the log axis
    w.screenshot("depth-view-tiny-gpt")
    assert w.errors == [], w.errors
    assert w.foreign_requests() == [], w.foreign_requests()


HOSTILE = '<img src=x onerror="window.__owned=1">'


def test_many_blocks_are_summed_up_searchable_and_names_stay_text(gradwatch_server, open_page):
    server = gradwatch_server()
    from websockets.sync.client import connect

    run_id = "forty-blocks"
    names = [f"{HOSTILE}.{i}" for i in range(40)]
    records = []
    for step in range(4):
        ratios = {f"{n}.w": (i + 1) * 1e-4 * (step + 1) for i, n in enumerate(names)}
        ratios.update({f"{n}.b": 1e-6 for n in names})
        records.append({"kind": "step", "step": step, "loss": 1.0,
                        "depth": {HOSTILE: [float(i + 1) for i in range(40)]},
                        "update_ratios": ratios})
    records.append({"kind": "alert", "step": 2, "code": "spike", "severity": "warning",
                    "state": "raised", "subject": HOSTILE, "message": "block 39 spiked",
                    "evidence": {"first_block": 39}})
    with connect(server.url + "/ws/ingest") as ws:
        ws.send(json.dumps({"type": "hello", "protocol": 1, "run_id": run_id, "run": "forty",
                            "config": {"depth": [HOSTILE], "depth_blocks": {HOSTILE: names}}}))
        ws.send(json.dumps({"type": "batch", "run_id": run_id, "rank": 0, "seq": 0,
                            "records": records}))
        assert json.loads(ws.recv(timeout=30)) == {"type": "ack", "seq": 0, "live": False}

    w = open_page(server, f"#/run/{run_id}")
    w.page.wait_for_selector("body[data-painted='1']")
    scroll_to(w.page, "chart-ratios")
    wait_js(w.page, "() => (document.getElementById('chart-ratios').data || []).length === 40")
    shown = chart(w.page, "chart-ratios",
                  "d.data.filter((t) => t.visible === true).map((t) => t.name)")
    # The eight largest (by their latest ratio) are drawn; the rest wait in the legend.
    escaped = HOSTILE.replace("<", "&lt;").replace(">", "&gt;")
    assert sorted(shown) == sorted(f"{escaped}.{i}" for i in range(32, 40))
    w.page.fill("#search-ratios", ".7")
    wait_js(w.page, "() => document.getElementById('chart-ratios').data"
                    ".filter((t) => t.visible === true).length === 1")
    shown = chart(w.page, "chart-ratios",
                  "d.data.filter((t) => t.visible === true).map((t) => t.name)")
    assert shown == [f"{escaped}.7"]
    find = f"d.data.find((t) => t.name === {json.dumps(escaped + '.7')})"
    trace = chart(w.page, "chart-ratios", find)
    assert trace["y"] == pytest.approx([8e-4 * (s + 1) for s in range(4)], rel=1e-12)
    heading = w.page.locator("section[data-stack] h2").inner_text()
    assert heading == f"Gradient flow through depth: {HOSTILE}"  # shown as text
    assert w.page.evaluate("() => window.__owned") is None
    assert w.page.locator("img[src=x]").count() == 0
    # A block's spike alert shows on its stack's depth heatmap, at its step.
    w.page.click("#alerts-list article.alert[data-code=spike] button.goto")
    w.page.wait_for_selector("section[data-stack][data-marked='2']")
    assert w.errors == [], w.errors

    # A replay unfolds the same from history: depth rows and the blocks' ratios.
    r = open_page(server, f"#/replay/{run_id}")
    r.page.wait_for_selector("#replay-speed")
    r.page.evaluate("() => { const v = window.gradwatch.state.view; v.seek(v.items.length); }")
    wait_js(r.page, "() => document.getElementById('replay-label').textContent"
                    ".startsWith('replayed all')")
    heat = r.page.get_attribute("section[data-stack] div.chart", "id")
    scroll_to(r.page, heat)
    wait_js(r.page, f"() => document.getElementById('{heat}').data[0].y.length === 4")
    scroll_to(r.page, "chart-ratios")
    wait_js(r.page, "() => (document.getElementById('chart-ratios').data || []).length === 40")
    trace = chart(r.page, "chart-ratios", find)
    assert trace["y"] == pytest.approx([8e-4 * (s + 1) for s in range(4)], rel=1e-12)
    assert r.errors == [], r.errors


#: an init script: the page's requests for /steps wait until __releaseScalars()
SCALARS_LATE = """(() => {
  let release;
  const gate = new Promise((ok) => { release = ok; });
  window.__releaseScalars = () => release();
  window.__scalarsAsked = 0;
  const fetchNow = window.fetch.bind(window);
  window.fetch = (input, init) => {
    const url = String(input instanceof Request ? input.url : input);
    if (!url.includes("/api/runs/") || !url.includes("/steps")) return fetchNow(input, init);
    window.__scalarsAsked += 1;
    return gate.then(() => fetchNow(input, init));
  };
})();"""


def test_the_ratio_note_follows_its_own_answer_without_a_scroll(
    gradwatch_server: Any, open_page: Any, raw_trainer: Any
) -> None:
    """A model with no stack of blocks still has per-block update ratios (one block per
    module). The ratio chart's history comes on a request of its own; below the fold,
    nothing redraws it until scrolled to, and its note said "No update ratios yet" on a
    run that has them (a printed or captured page kept it). Its twin, whose optimizer
    stepped copies of the parameters, has none and says why."""
    server = gradwatch_server()
    stepped, copies = raw_trainer(server, "ratios"), raw_trainer(server, "no ratios")
    for trainer, ratios in ((stepped, True), (copies, False)):
        records = []
        for s in range(4):
            rec = step_record(s)
            if ratios:
                rec["update_ratios"] = {"lstm.weight_ih_l0": 1e-3 * (s + 1), "head.weight": 2e-4}
            records.append(rec)
        trainer.send([*records, end_record(3)])
    # A short window: the ratio panel lies beyond the observer's margin.
    small = {"width": 1440, "height": 400}
    w = open_page(server, "#/", viewport=small)
    # The scalars (/steps) answer after the ratios: the order that once left the note
    # on (both histories set whether the chart had data, and the last answer won). The
    # page's fetch of /steps waits for a gate this test opens.
    w.page.add_init_script(SCALARS_LATE)
    w.page.goto(f"{server.http}/?scalars=late#/run/{stepped.run_id}")  # a new document
    wait_js(w.page, """async () => {
        const v = window.gradwatch.state.view;
        const r = v && v.depth && v.depth.ratios.view;
        if (!r || !r.history) return false;
        const late = new Promise((ok) => setTimeout(() => ok(false), 20));
        return await Promise.race([Promise.resolve(r.history).then(() => true), late]); }""")
    assert w.page.evaluate("() => window.__scalarsAsked") > 0
    w.page.evaluate("() => window.__releaseScalars()")
    w.page.wait_for_selector("body[data-scalars='1']")
    wait_js(w.page, "() => document.querySelector('#panel-ratios .nodata').hidden", timeout_s=15)
    assert w.page.evaluate(
        "() => document.querySelector('#panel-ratios').getBoundingClientRect().top") > 600
    scroll_to(w.page, "chart-ratios")
    names = chart(w.page, "chart-ratios", "d.data.map((t) => t.name)")
    assert {"lstm", "head"} <= set(names), names
    assert w.errors == [], w.errors

    twin = open_page(server, f"#/run/{copies.run_id}", viewport=small)
    twin.page.wait_for_selector("body[data-scalars='1']")
    twin.page.locator("#panel-ratios").scroll_into_view_if_needed()
    wait_js(twin.page, "() => !!document.getElementById('chart-ratios').data")
    note = twin.page.locator("#panel-ratios .nodata")
    assert note.is_visible() and twin.page.is_hidden("#chart-ratios")
    assert "torch.optim.Optimizer" in note.inner_text()
    assert "steps copies of the parameters" in note.inner_text()
    assert twin.errors == [], twin.errors


PARAMS = ["blocks.3.attn.in_proj_weight", "blocks.30.mlp.0.weight", "blocks.3", "head.weight",
          "scale", "enc.layers.1.w", "enc.layers.10.w", "a.b.c.d"]
BLOCK_NAMES = [["blocks.3", "blocks.30"], [], ["enc.layers.1", "enc.layers.10", "enc"]]
RATIOS = [[1e-3, "Infinity", 2e-3], ["NaN", "Infinity"], ["NaN"], [5e-324, 0.0], ["-Infinity"],
          [1.0, "NaN", 3.0]]


def test_live_blocks_are_summed_up_as_the_server_does(gradwatch_server, open_page):
    """The page groups live ratios per block as /update_ratios does (server/depth_reads):
    the same block for each parameter, the same value for each set of ratios."""
    from gradwatch.protocol.codec import protocol_number
    from gradwatch.server.depth_reads import block_of, block_ratio

    server = gradwatch_server()
    w = open_page(server)
    w.page.wait_for_selector("body[data-painted='1']")
    js: Any = w.page.evaluate(
        """async ([params, blocks, ratios]) => {
            const d = await import("/static/js/depth.js");
            const wire = (x) => (Number.isFinite(x) ? x : String(x));
            return {
                owners: blocks.map((b) => params.map((p) => d.blockOf(p, b))),
                values: ratios.map((r) => wire(d.blockRatio(r))),
            };
        }""",
        [PARAMS, BLOCK_NAMES, RATIOS],
    )
    assert js["owners"] == [[block_of(p, b) for p in PARAMS] for b in BLOCK_NAMES]
    floats = [[float(v) if isinstance(v, str) else v for v in r] for r in RATIOS]
    assert js["values"] == [protocol_number(block_ratio(r)) for r in floats]
    assert js["owners"][0][:3] == ["blocks.3", "blocks.30", "blocks"]
    assert w.errors == []
