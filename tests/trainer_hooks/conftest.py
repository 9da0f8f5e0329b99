"""Fixtures shared by the capture tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch import nn

from gradwatch.trainer_hooks.quantities.timesteps import RecurrentTimesteps

CapturedStep = Callable[..., dict[str, Any]]


def _captured_step(model: nn.Module, step: Callable[[], Any], **options: Any) -> dict[str, Any]:
    """One captured step through attach/start_step/finish_step/encode; the record."""
    q = RecurrentTimesteps(**options)
    q.attach(model)
    try:
        q.start_step(True)
        step()
        payload = q.finish_step(None)
        host = {m: {k: v.cpu() for k, v in s.items()} for m, s in payload["timesteps"].items()}
        return q.encode({"timesteps": host})
    finally:
        q.detach()


@pytest.fixture
def captured_step() -> CapturedStep:
    """`captured_step(model, step, **options)`: drive RecurrentTimesteps by hand for one
    captured step (no Monitor) and return the record fields it encodes."""
    return _captured_step


Torchrun = Callable[..., subprocess.CompletedProcess[str]]
TORCHRUN = Path(sys.executable).with_name("torchrun")


def _marked(marker: bytes) -> list[int]:
    """The processes whose environment holds ``marker`` (this user's, from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:  # gone, or another user's
                continue
    return found


def _torchrun(
    script: Path, *args: str, nproc: int = 2, timeout: float = 100.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` on ``nproc`` CPU ranks with the real ``torchrun`` binary (the one
    beside this interpreter), rendezvous and gloo on the loopback only. Whatever
    happens (a timeout, a failing rank, a failing test), the launcher and every rank
    are killed before this returns: torchrun starts each rank in a session of its
    own, so they are found by a marker in their environment, which they inherit.

    A worker whose model holds the process group (DDP, FSDP2) must drop it before
    ``dist.destroy_process_group()``: that call drops only c10d's own references, and
    a gloo group destroyed later, at interpreter exit, aborted a rank ("terminate
    called without an active exception", SIGABRT) in 3 of 20 runs here, with or
    without gradwatch and with or without a barrier first; 0 of 25 once dropped."""
    if not TORCHRUN.exists():
        pytest.fail(f"expected the torchrun binary beside {sys.executable}, got none")
    marker = f"GRADWATCH_TEST_TORCHRUN={uuid.uuid4().hex}"
    environ = dict(os.environ if env is None else env)
    environ.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")
    environ["GRADWATCH_TEST_TORCHRUN"] = marker.partition("=")[2]
    command = [str(TORCHRUN), "--standalone", "--local-addr", "127.0.0.1",
               "--nproc-per-node", str(nproc), "--max-restarts", "0", "--monitor-interval", "0.1",
               str(script), *args]
    proc = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(command, proc.returncode, output, "")
    finally:
        proc.kill()  # first the launcher (it restarts nothing then), then its ranks
        proc.wait()
        for pid in _marked(marker.encode()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def torchrun() -> Torchrun:
    """`torchrun(script, *args, nproc=2, timeout=100)`: the completed launcher (its
    output and return code); no rank outlives the call."""
    return _torchrun
