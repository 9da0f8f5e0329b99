"""Where the sender keeps its files: the spool, and beside it the refused batches.

Example:
    >>> from pathlib import Path
    >>> rejected_path(Path("runs/run.jsonl")).as_posix()
    'runs/run.rejected.jsonl'
    >>> default_spool_path({"run_id": "6f1c", "rank": 1}).as_posix()
    '.gradwatch/spool/6f1c-rank1.jsonl'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def default_spool_path(hello: dict[str, Any]) -> Path:
    """``.gradwatch/spool/<run_id>-rank<rank>.jsonl`` under the working directory."""
    return Path(".gradwatch") / "spool" / f"{hello['run_id']}-rank{int(hello['rank'])}.jsonl"


def rejected_path(spool: Path) -> Path:
    """Where batches the server refused for good go: ``run.jsonl`` -> ``run.rejected.jsonl``."""
    name = spool.name[: -len(".jsonl")] if spool.name.endswith(".jsonl") else spool.name
    return spool.with_name(name + ".rejected.jsonl")


def fresh_path(path: Path) -> Path:
    """``path``, or ``stem-2.jsonl``, ``stem-3.jsonl``... when it already holds data.

    A non-empty spool at start is someone's undelivered data (an earlier run): this
    sink removes its spool once delivered, so it must never share a file.
    """
    if not path.exists() or path.stat().st_size == 0:
        return path
    stem = path.name[: -len(".jsonl")] if path.name.endswith(".jsonl") else path.name
    n = 2
    while True:
        candidate = path.with_name(f"{stem}-{n}.jsonl")
        if not candidate.exists() or candidate.stat().st_size == 0:
            return candidate
        n += 1


def upload_command(spool: str | os.PathLike[str], url: str, token: bool) -> str:
    """The command that sends ``spool`` later, for a warning: with ``--token`` named (not
    its value, a secret) where the sender used one, since the server will ask for it.

    Example:
        >>> upload_command("run.jsonl", "ws://gpu-box:8765", token=True)
        'gradwatch upload run.jsonl --server ws://gpu-box:8765 --token <the ingest token>'
    """
    command = f"gradwatch upload {os.fspath(spool)} --server {url}"
    return command + " --token <the ingest token>" if token else command
