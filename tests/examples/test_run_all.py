"""examples/run_all.py runs every scenario and its twin; the scripts' command lines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gradwatch.protocol import read_spool


def test_run_all_plans_every_scenario_and_its_twin(load_example: Any) -> None:
    run_all = load_example("run_all")
    plan = run_all.commands(run_all.parse(["--server", "ws://127.0.0.1:9", "--token", "t"]))
    runs = sorted(argv[argv.index("--run") + 1] for _, argv in plan)
    names = ["long_lstm", "rotation_lstm", "seq2seq_attention", "tiny_gpt", "tree_gru"]
    assert runs == sorted(n + suffix for n in names for suffix in ("", "-fixed"))
    for _, argv in plan:
        assert argv[argv.index("--server") + 1] == "ws://127.0.0.1:9"
        assert argv[argv.index("--token") + 1] == "t"
        assert ("--fixed" in argv) == argv[argv.index("--run") + 1].endswith("-fixed")


@pytest.mark.slow
def test_run_all_runs_each_in_its_own_process_and_writes_its_spool(
    tmp_path: Path, load_example: Any, spool_records: Any
) -> None:
    argv = ["--only", "long_lstm", "--steps", "2", "--spool-dir", str(tmp_path)]
    results = load_example("run_all").main(argv)
    assert results == [("long_lstm", 0), ("long_lstm-fixed", 0)]
    for run, _ in results:
        hello = next(read_spool(tmp_path / f"{run}.jsonl"))
        assert hello["type"] == "hello" and hello["run"] == run
        assert sum(r["kind"] == "step" for r in spool_records(tmp_path / f"{run}.jsonl")) == 2


def test_example_without_server_or_spool_records_under_dot_gradwatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, load_example: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GRADWATCH_SERVER", raising=False)
    summary = load_example("long_lstm").main(["--steps", "1", "--fixed", "--quiet"])
    expected = Path(".gradwatch") / "examples" / "long_lstm-fixed.jsonl"
    assert summary["output"] == str(expected) and (tmp_path / expected).is_file()


def test_example_refuses_a_step_count_below_one(
    capsys: pytest.CaptureFixture[str], load_example: Any
) -> None:
    with pytest.raises(SystemExit):
        load_example("tree_gru").main(["--steps", "0"])
    assert "--steps: expected a positive number, got 0" in capsys.readouterr().err


def test_max_seconds_stops_a_slowing_bug_early(tmp_path: Path, load_example: Any) -> None:
    spool = tmp_path / "r.jsonl"
    argv = ["--steps", "50", "--max-seconds", "0", "--spool", str(spool), "--quiet"]
    summary = load_example("rotation_lstm").main(argv)
    assert summary["steps"] == 1  # the first step already used the whole budget
