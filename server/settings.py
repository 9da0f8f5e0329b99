"""The server's one settings object; ``GRADWATCH_*`` environment variables are read here only.

Every part of the server takes what it needs from a :class:`Settings` passed down by
:func:`gradwatch.server.app.create_app`, so tests build one in a line and nothing
reads the environment behind their back.

Example:
    >>> s = Settings(db="runs.db", token="t0p")
    >>> s.db_kind
    'sqlite'
    >>> Settings(db="postgresql://u@127.0.0.1/db").db_kind
    'postgresql'
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gradwatch.protocol.messages import MAX_MESSAGE_BYTES

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
# Pages that may embed the dashboard in a frame by default: a Jupyter (or any page) on
# this machine, whatever its port (CSP host-sources; http also matches https). CSP has
# no syntax for IPv6 addresses (Chromium refuses "http://[::1]:*"): use localhost.
LOOPBACK_FRAME_ANCESTORS = ("http://localhost:*", "http://127.0.0.1:*")
_FRAME_ANCESTOR = re.compile(r"https?://(\*\.)?[a-z0-9][a-z0-9.\-]*(:(\d{1,5}|\*))?")


def frame_ancestor_problem(origin: str) -> str | None:
    """Why ``origin`` cannot be a page allowed to frame the dashboard, or None.

    An origin is ``scheme://host[:port]``, as CSP names sources: the port may be ``*``,
    the host may start with ``*.`` and is a name or an IPv4 address (CSP cannot name
    IPv6 addresses); ``*`` alone is any page, ``none`` no page at all.

    >>> frame_ancestor_problem("https://hub.lab.example:*") is None
    True
    >>> frame_ancestor_problem("https://hub.lab.example/user")[-40:]
    "8888, got 'https://hub.lab.example/user'"
    """
    if origin in ("*", "none") or _FRAME_ANCESTOR.fullmatch(origin.lower()):
        return None
    return (
        "frame ancestor: expected an origin such as https://jupyter.example.org:8888,"
        f" got {origin[:80]!r}"
    )


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a bind address or a name) stays on this machine."""
    name = host.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def user_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """This user's gradwatch folder: ``$XDG_DATA_HOME/gradwatch`` (default
    ``~/.local/share/gradwatch``) on Linux, ``~/Library/Application Support/gradwatch``
    on macOS, ``%LOCALAPPDATA%\\gradwatch`` on Windows."""
    env = os.environ if environ is None else environ
    home = Path(env.get("HOME") or Path.home())
    if sys.platform == "win32":
        base = Path(env.get("LOCALAPPDATA") or home / "AppData" / "Local")
    elif sys.platform == "darwin":
        base = home / "Library" / "Application Support"
    else:
        xdg = env.get("XDG_DATA_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else home / ".local" / "share"
    return base / "gradwatch"


def default_db(environ: Mapping[str, str] | None = None) -> str:
    """The one database every command uses without ``--db`` (``serve``, ``demo``,
    ``report``): ``$GRADWATCH_DB``, else ``gradwatch.db`` in :func:`user_data_dir`, the
    same file whatever folder a command starts in.

    Example:
        >>> default_db({"GRADWATCH_DB": "postgresql://u@db/gw"})
        'postgresql://u@db/gw'
        >>> default_db({"HOME": "/home/ada"}).endswith("gradwatch.db")
        True
    """
    env = os.environ if environ is None else environ
    return env.get("GRADWATCH_DB") or str(user_data_dir(env) / "gradwatch.db")


@dataclass(frozen=True)
class Settings:
    """Everything the server can be told.

    ``db`` is a SQLite file path or a ``postgresql://`` URL (:meth:`from_env`, as the
    commands use it, defaults it to :func:`default_db`). ``token`` lets trainers
    write and viewers read; ``view_token`` only reads. ``allowed_hosts`` extends the loopback names
    accepted in the ``Host`` header (against DNS rebinding); ``"*"`` accepts any.
    """

    host: str = "127.0.0.1"
    port: int = 8765
    db: str = "gradwatch.db"
    token: str | None = None
    view_token: str | None = None
    allowed_hosts: tuple[str, ...] = ()
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # Live messages one viewer may have queued before the oldest are dropped.
    live_queue_size: int = 256
    # Bytes of live messages one viewer may have queued: past this it has fallen
    # behind for good and is dropped (a ``lagged`` notice, then the socket aborted).
    live_queue_bytes: int = 16 << 20
    # A viewer whose socket takes one message for longer than this is dropped too.
    live_send_timeout_s: float = 30.0
    # Seconds a connection has to send a request's headers (half-sent requests would
    # otherwise hold a file descriptor for ever), and the most connections served at
    # once (beyond it HTTP requests get 503 at once).
    header_timeout_s: float = 10.0
    max_connections: int = 4096
    # Batches one ingest connection may have submitted but not yet acknowledged.
    ingest_window: int = 64
    # A run with no connected trainer and no write for this long is "stale".
    stale_after_s: float = 60.0
    # SQLite "NORMAL" (WAL: survives a crash of the server process; the last commits
    # may be lost on power loss) or "FULL" (fsync on every commit).
    sqlite_synchronous: str = "NORMAL"
    # Batches of several connections written in one transaction at most.
    group_commit: int = 64
    # SQLite: write in a child process (store/writer_process.py), so validation and
    # writing each have a core; False writes on a thread of the server process.
    writer_process: bool = True
    serve_client: bool = True
    # A connected run with no step for this many median step times (and at least
    # stalled_min_s seconds) is "stalled".
    stalled_factor: float = 20.0
    stalled_min_s: float = 30.0
    # /api/health answers 503 when writes are waiting and the store's writer answered
    # none for this long (a stopped writer process, a lock held by another program).
    writer_stall_s: float = 15.0
    # Where alerts are POSTed (server/webhooks.py), and the least severity sent.
    alert_webhooks: tuple[str, ...] = ()
    alert_min_severity: str = "warning"
    # The dashboard's address as people reach it, for links in webhooks (default: the
    # bind address and port).
    public_url: str | None = None
    # Origins whose pages may show the dashboard in a frame (CSP frame-ancestors),
    # besides LOOPBACK_FRAME_ANCESTORS; ("none",) lets no page frame it.
    frame_ancestors: tuple[str, ...] = ()

    @property
    def db_kind(self) -> str:
        return "postgresql" if self.db.startswith(("postgresql://", "postgres://")) else "sqlite"

    def host_allowed(self, host: str) -> bool:
        """Whether an HTTP ``Host`` name (port stripped) may reach this server."""
        name = host.lower()
        if "*" in self.allowed_hosts or name in LOOPBACK_HOSTS or is_loopback(name):
            return True
        if name == self.host.lower() and self.host not in ("0.0.0.0", "::"):  # noqa: S104
            return True
        return name in {h.lower() for h in self.allowed_hosts}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Settings from ``GRADWATCH_*`` variables, then ``overrides`` (the CLI's flags).

        Variables: GRADWATCH_HOST, _PORT, _DB, _TOKEN, _VIEW_TOKEN, _ALLOWED_HOSTS
        (comma separated), _MAX_MESSAGE_BYTES, _LIVE_QUEUE_SIZE, _LIVE_QUEUE_BYTES,
        _SQLITE_SYNCHRONOUS, _HEADER_TIMEOUT_S, _STALE_AFTER_S, _WRITER (process or thread),
        _STALLED_FACTOR, _STALLED_MIN_S, _WRITER_STALL_S, _ALERT_WEBHOOK (URLs, comma or
        space separated), _ALERT_MIN_SEVERITY, _PUBLIC_URL, _FRAME_ANCESTORS (origins,
        comma or space separated).
        """
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        text = {
            "host": "GRADWATCH_HOST",
            "db": "GRADWATCH_DB",
            "token": "GRADWATCH_TOKEN",
            "view_token": "GRADWATCH_VIEW_TOKEN",
            "sqlite_synchronous": "GRADWATCH_SQLITE_SYNCHRONOUS",
        }
        for name, var in text.items():
            if env.get(var):
                values[name] = env[var]
        numbers = {
            "port": "GRADWATCH_PORT",
            "max_message_bytes": "GRADWATCH_MAX_MESSAGE_BYTES",
            "live_queue_size": "GRADWATCH_LIVE_QUEUE_SIZE",
            "live_queue_bytes": "GRADWATCH_LIVE_QUEUE_BYTES",
        }
        for name, var in numbers.items():
            if env.get(var):
                try:
                    values[name] = int(env[var])
                except ValueError:
                    raise ValueError(f"{var}: expected an integer, got {env[var]!r}") from None
        writer = env.get("GRADWATCH_WRITER")
        if writer:
            if writer not in ("process", "thread"):
                raise ValueError(f"GRADWATCH_WRITER: expected process or thread, got {writer!r}")
            values["writer_process"] = writer == "process"
        floats = {  # field: (variable, what it holds, for the error)
            "stale_after_s": ("GRADWATCH_STALE_AFTER_S", "seconds"),
            "header_timeout_s": ("GRADWATCH_HEADER_TIMEOUT_S", "seconds"),
            "stalled_factor": ("GRADWATCH_STALLED_FACTOR", "a number"),
            "stalled_min_s": ("GRADWATCH_STALLED_MIN_S", "a number"),
            "writer_stall_s": ("GRADWATCH_WRITER_STALL_S", "seconds"),
        }
        for name, (var, what) in floats.items():
            if env.get(var):
                try:
                    values[name] = float(env[var])
                except ValueError:
                    raise ValueError(f"{var}: expected {what}, got {env[var]!r}") from None
        if env.get("GRADWATCH_ALERT_WEBHOOK"):
            # several URLs: separated by commas or spaces
            urls = env["GRADWATCH_ALERT_WEBHOOK"].replace(",", " ").split()
            values["alert_webhooks"] = tuple(urls)
        if env.get("GRADWATCH_FRAME_ANCESTORS"):
            origins = env["GRADWATCH_FRAME_ANCESTORS"].replace(",", " ").split()
            values["frame_ancestors"] = tuple(origins)
        for name, var in (("alert_min_severity", "GRADWATCH_ALERT_MIN_SEVERITY"),
                          ("public_url", "GRADWATCH_PUBLIC_URL")):
            if env.get(var):
                values[name] = env[var]
        if env.get("GRADWATCH_ALLOWED_HOSTS"):
            values["allowed_hosts"] = tuple(
                h.strip() for h in env["GRADWATCH_ALLOWED_HOSTS"].split(",") if h.strip()
            )
        values.setdefault("db", default_db(env))
        values.update({k: v for k, v in overrides.items() if v is not None})
        settings = replace(cls(), **values)  # type: ignore[arg-type]
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ``ValueError`` with "expected X, got Y" for a setting that cannot work."""
        if self.sqlite_synchronous.upper() not in ("NORMAL", "FULL", "EXTRA"):
            raise ValueError(
                "sqlite_synchronous: expected NORMAL, FULL or EXTRA,"
                f" got {self.sqlite_synchronous!r}"
            )
        for name in ("max_message_bytes", "live_queue_size", "live_queue_bytes",
                     "ingest_window", "group_commit"):
            if int(getattr(self, name)) < 1:
                raise ValueError(
                    f"{name}: expected a positive integer, got {getattr(self, name)!r}"
                )
        if self.alert_min_severity not in ("info", "warning", "error"):
            raise ValueError(
                "alert_min_severity: expected info, warning or error,"
                f" got {self.alert_min_severity!r}"
            )
        for url in self.alert_webhooks:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"alert webhook: expected an http(s):// URL, got {url!r}")
        for origin in self.frame_ancestors:
            problem = frame_ancestor_problem(origin)
            if problem is not None:
                raise ValueError(problem)
        if "none" in self.frame_ancestors and len(self.frame_ancestors) > 1:
            raise ValueError(
                "frame ancestors: expected 'none' alone (no page may frame the dashboard),"
                f" got {list(self.frame_ancestors)!r}"
            )
        if not 0 <= self.port < 65536:
            raise ValueError(f"port: expected 0..65535, got {self.port}")
