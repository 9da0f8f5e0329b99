"""Lines printed for a newcomer (``gradwatch serve``, ``gradwatch demo``, ``report``).

Its own module so that server/demo.py needs nothing of server/cli.py, which starts it.

Example:
    >>> "ssh -N -L 8000:127.0.0.1:8000" in tunnel_hint(8000)
    True
"""

from __future__ import annotations

import getpass
import os
import socket


def tunnel_hint(port: int) -> str:
    """How to open a loopback dashboard from another machine (an SSH tunnel)."""
    return (
        "  hint, if your browser is on another machine: ssh -N -L "
        f"{port}:127.0.0.1:{port} {getpass.getuser()}@{socket.gethostname()}"
        f" there, then open http://127.0.0.1:{port}/ (docs/REMOTE.md)"
    )


# Where earlier versions kept their databases: `serve` in the folder it started in,
# `demo` in .gradwatch/ there. Found beside a command, they are named in its messages.
FORMER_DBS = ("gradwatch.db", ".gradwatch/demo.db")


def default_db_help() -> str:
    """How the help texts name the one default database."""
    from .settings import user_data_dir

    return f"$GRADWATCH_DB, else {user_data_dir() / 'gradwatch.db'}"


def former_databases(db: str) -> str:
    """A hint naming the databases an earlier version left in this folder, or ''."""
    here = [p for p in FORMER_DBS
            if os.path.isfile(p) and os.path.abspath(p) != os.path.abspath(db)]
    if not here:
        return ""
    return " (this folder holds " + " and ".join(here) + ", where earlier versions wrote:" \
        + " --db " + here[0] + " reads it)"
