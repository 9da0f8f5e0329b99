from pathlib import Path

import pytest

from gradwatch.protocol import SpoolError, SpoolWriter, read_spool


def test_spool_round_trips_messages_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    with SpoolWriter(path) as w:
        w.write({"type": "hello", "protocol": 1, "run": "<b>x</b>"})
        w.write({"type": "batch", "seq": 0, "records": [{"kind": "step", "loss": float("inf")}]})
    messages = list(read_spool(path))
    assert [m["type"] for m in messages] == ["hello", "batch"]
    assert messages[0]["run"] == "<b>x</b>"
    assert messages[1]["records"][0]["loss"] == "Infinity"


def test_a_torn_last_line_is_skipped_but_earlier_lines_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"type": "hello"}\n{"type": "batch", "seq"')
    assert [m["type"] for m in read_spool(path)] == ["hello"]


def test_a_bad_line_in_the_middle_names_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text('{"type": "hello"}\nnot json\n{"type": "batch"}\n')
    with pytest.raises(SpoolError, match=r"run.jsonl:2: expected one JSON message"):
        list(read_spool(path))


def test_a_line_without_type_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "run.jsonl"
    path.write_text("[1, 2]\n")
    with pytest.raises(SpoolError, match="expected a JSON object with a 'type' field, got list"):
        list(read_spool(path))
