"""Lines printed for a newcomer (``gradwatch serve``, ``gradwatch demo``).

Its own module so that server/demo.py needs nothing of server/cli.py, which starts it.

Example:
    >>> "ssh -N -L 8000:127.0.0.1:8000" in tunnel_hint(8000)
    True
"""

from __future__ import annotations

import getpass
import socket


def tunnel_hint(port: int) -> str:
    """How to open a loopback dashboard from another machine (an SSH tunnel)."""
    return (
        "  hint, if your browser is on another machine: ssh -N -L "
        f"{port}:127.0.0.1:{port} {getpass.getuser()}@{socket.gethostname()}"
        f" there, then open http://127.0.0.1:{port}/ (docs/REMOTE.md)"
    )
