"""A real notebook, executed by nbclient in a real IPython kernel: what a monitor shows."""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient

TRAIN = """
import torch
from gradwatch.trainer_hooks import watch
model = torch.nn.GRU(3, 8)
monitor = watch(model, run={run!r}, server={server}, spool={spool!r}, diagnose=False)
for _ in range(3):
    out, _ = model(torch.randn(4, 2, 3))
    out.pow(2).mean().backward()
    monitor.step(out.pow(2).mean())
monitor.flush(10)
"""


def execute(cells: list[str], cwd: Path) -> list[dict[str, Any]]:
    """Run the cells in a fresh python3 kernel; every output of every cell."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, kernel_name="python3", timeout=120,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return [out for cell in nb.cells for out in cell.outputs]


def html_of(outputs: list[dict[str, Any]]) -> list[str]:
    return [o["data"]["text/html"] for o in outputs if "text/html" in o.get("data", {})]


@pytest.mark.slow
def test_a_monitor_shows_the_live_run_view_when_its_server_answers(
    gradwatch_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = gradwatch_server()
    outputs = execute(
        [TRAIN.format(run="<b>nb</b>", server=repr(server.url), spool=str(tmp_path / "s.jsonl")),
         "monitor", "import gradwatch.notebook as gn\ngn.show(monitor)",
         "gn.show(monitor.run_id, server=" + repr(server.http) + ")", "monitor.close()"],
        tmp_path,
    )
    shown = html_of(outputs)
    assert len(shown) == 3, outputs
    (run_id,) = set(re.findall(r"#/run/([0-9a-f-]{36})/0", shown[0]))
    for page in shown:
        assert f'<iframe src="{server.http}/#/run/{run_id}/0"' in page
    # the run's name is text, never markup
    assert "&lt;b&gt;nb&lt;/b&gt;" in shown[0] and "<b>nb</b>" not in shown[0]


@pytest.mark.slow
def test_without_a_server_a_monitor_shows_its_spool_and_the_upload_command(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "offline.jsonl"
    outputs = execute(
        [TRAIN.format(run="offline", server="None", spool=str(spool)), "monitor",
         "monitor.close()\nimport gradwatch.notebook as gn\n"
         "gn.show(monitor, server='ws://127.0.0.1:9')"],
        tmp_path,
    )
    first, second = html_of(outputs)
    assert "<iframe" not in first and "<iframe" not in second
    text = html.unescape(first)
    assert str(spool) in text
    assert f"gradwatch upload {spool} --server ws://127.0.0.1:8765" in text
    assert f"gradwatch upload {spool} --server ws://127.0.0.1:9" in html.unescape(second)
    assert spool.is_file() and spool.stat().st_size > 0
