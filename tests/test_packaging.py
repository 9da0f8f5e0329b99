"""The distribution's shape: one `gradwatch/` tree in the wheel, and a CLI that answers."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build_dir = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(out), str(ROOT)],
        check=True,
        cwd=build_dir,
        capture_output=True,
    )
    (path,) = out.glob("gradwatch-*.whl")
    return path


def test_wheel_installs_nothing_at_top_level_but_gradwatch(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"gradwatch"}


def test_wheel_carries_every_part_and_the_dashboard(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in (
        "gradwatch/protocol/messages.py",
        "gradwatch/trainer_hooks/__init__.py",
        "gradwatch/server/cli.py",
        "gradwatch/client/index.html",
    ):
        assert module in names, f"{module} missing from the wheel"


def test_wheel_keeps_torch_out_of_the_base_and_server_installs(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [
            line for line in z.read(meta).decode().splitlines() if line.startswith("Requires-Dist:")
        ]
    torch_lines = [line for line in requires if line.split()[1].startswith("torch")]
    assert torch_lines and all('extra == "torch"' in line for line in torch_lines), torch_lines


@pytest.mark.parametrize("command", ["serve", "demo", "report", "upload"])
def test_every_subcommand_answers_help(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gradwatch.server.cli", command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"gradwatch {command}" in done.stdout
