"""The distribution's shape: one `gradwatch/` tree in the wheel, and a CLI that answers."""

from __future__ import annotations

import re
import shutil
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


def _dockerfile_copies(dockerfile: Path) -> list[str]:
    """The paths a Dockerfile's COPY lines take from the build context."""
    sources: list[str] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and not any(w.startswith("--") for w in words):
            sources += words[1:-1]
    return sources


def test_the_server_image_installs_from_what_its_dockerfile_copies(tmp_path: Path) -> None:
    # No Docker engine here: the image's `pip install ".[server]"` is rebuilt as a
    # wheel from exactly the files its COPY lines bring (a package left out fails it).
    context = tmp_path / "context"
    context.mkdir()
    for source in _dockerfile_copies(ROOT / "Dockerfile"):
        for path in ROOT.glob(source):
            target = context / path.relative_to(ROOT)
            if path.is_dir():
                shutil.copytree(path, target, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(path, target)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-q", "-w", str(tmp_path / "out"), str(context)],
        cwd=tmp_path, capture_output=True, text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_compose_defaults_start_a_server_reachable_through_its_port() -> None:
    # The image listens on 0.0.0.0 (Dockerfile ENV), where `gradwatch serve` refuses
    # short tokens: the compose file's defaults must pass the server's own check.
    import yaml

    from gradwatch.server.serving import token_problem
    from gradwatch.server.settings import Settings

    environment = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"][
        "server"]["environment"]
    defaults = {
        name: re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", str(value))
        for name, value in environment.items()
    }
    settings = Settings.from_env({**defaults, "GRADWATCH_HOST": "0.0.0.0"})
    assert token_problem(settings, loopback=False) is None
