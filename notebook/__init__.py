"""gradwatch in Jupyter: a run shows itself in the notebook.

A :class:`~gradwatch.trainer_hooks.Monitor` as the last expression of a cell shows
the run's live view (an iframe of the dashboard) when its server answers, and else
the spool file its records are in with the ``gradwatch upload`` command that sends
them later. :func:`show` does the same explicitly, for a monitor or for a run id on
a server. Nothing here imports IPython: Jupyter asks objects for ``_repr_html_``.

Example:
    >>> from gradwatch.notebook import run_view_url
    >>> run_view_url("ws://127.0.0.1:8765/ws/ingest", "3f2a", rank=1)
    'http://127.0.0.1:8765/#/run/3f2a/1'
"""

from __future__ import annotations

import html
import os
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

__all__ = ["View", "reachable", "run_view_url", "show", "view_of", "ws_base"]

_HTTP = {"ws": "http", "wss": "https", "http": "http", "https": "https"}


def http_base(server: str) -> str:
    """``ws://host:port/ws/ingest`` (or ``http://host:port``) -> ``http://host:port``."""
    parts = urlsplit(server.strip())
    scheme = _HTTP.get(parts.scheme.lower())
    if scheme is None or not parts.hostname:
        raise ValueError(f"expected a server URL such as 'ws://127.0.0.1:8765', got {server!r}")
    return urlunsplit((scheme, parts.netloc, "", "", ""))


def ws_base(server: str) -> str:
    """``http://host:port`` (or ``ws://host:port/ws/ingest``) -> ``ws://host:port``."""
    base = http_base(server)
    return "ws" + base[4:] if base.startswith("http") else base


def run_view_url(server: str, run_id: str, rank: int = 0, view_token: str | None = None) -> str:
    """The dashboard's page of one run and rank (``#/run/<id>/<rank>``)."""
    token = f"?token={quote(view_token, safe='')}" if view_token else ""
    return f"{http_base(server)}/{token}#/run/{quote(run_id, safe='')}/{rank}"


def reachable(server: str, timeout: float = 1.0) -> bool:
    """Whether the server answers ``/api/health`` within ``timeout`` seconds."""
    try:
        # http or https only: http_base refuses any other scheme
        with urllib.request.urlopen(f"{http_base(server)}/api/health", timeout=timeout) as a:  # noqa: S310
            return bool(a.status == 200)
    except (OSError, urllib.error.URLError, ValueError):
        return False


class View:
    """What a notebook shows for a run: ``_repr_html_`` for Jupyter, ``str`` elsewhere.

    Example:
        >>> v = View(url="http://127.0.0.1:8765/#/run/ab/0", run="lstm")
        >>> 'iframe' in v._repr_html_()
        True
    """

    def __init__(
        self,
        *,
        run: str,
        url: str | None = None,
        spool: str | None = None,
        server: str | None = None,
        height: int = 640,
    ) -> None:
        self.run, self.url, self.spool, self.server, self.height = run, url, spool, server, height

    def upload_command(self) -> str | None:
        """The command that sends the spool to a server later."""
        if not self.spool:
            return None
        target = self.server or "ws://127.0.0.1:8765"
        return f"gradwatch upload {self.spool} --server {target}"

    def _repr_html_(self) -> str:
        name = html.escape(self.run)
        if self.url:
            src = html.escape(self.url, quote=True)
            return (
                f'<div class="gradwatch-run"><p>gradwatch run <b>{name}</b>: '
                f'<a href="{src}" target="_blank" rel="noopener">open the dashboard</a></p>'
                f'<iframe src="{src}" width="100%" height="{int(self.height)}" '
                f'style="border:1px solid #ccc" title="gradwatch run {name}"></iframe></div>'
            )
        lines = [f"<p>gradwatch run <b>{name}</b>: no server answered"]
        if self.server:
            lines[0] += f" at <code>{html.escape(self.server)}</code>"
        lines[0] += ".</p>"
        command = self.upload_command()
        if command:
            lines.append(f"<p>Its records are in <code>{html.escape(str(self.spool))}</code>; "
                         "send them to a server later with:</p>")
            lines.append(f"<pre>{html.escape(command)}</pre>")
        return '<div class="gradwatch-run">' + "".join(lines) + "</div>"

    def __str__(self) -> str:
        if self.url:
            return f"gradwatch run {self.run}: {self.url}"
        command = self.upload_command()
        where = f" records in {self.spool}; send them with: {command}" if command else ""
        return f"gradwatch run {self.run}: no server answered;{where}"

    __repr__ = __str__


def view_of(
    run_or_monitor: Any,
    server: str | None = None,
    view_token: str | None = None,
    height: int = 640,
    timeout: float = 1.0,
) -> View:
    """The :class:`View` of a Monitor, or of a run id on ``server``.

    ``view_token`` (default ``$GRADWATCH_VIEW_TOKEN``) goes into the link; the ingest
    token a monitor streams with is never put into the page.
    """
    token = view_token if view_token is not None else os.environ.get("GRADWATCH_VIEW_TOKEN")
    if isinstance(run_or_monitor, str):
        base = server or "http://127.0.0.1:8765"
        url = run_view_url(base, run_or_monitor, 0, token) if reachable(base, timeout) else None
        return View(run=run_or_monitor, url=url, server=base, height=height)
    monitor = run_or_monitor
    hello = monitor.hello
    sink = monitor._pipeline.sink
    target = server or getattr(sink, "url", None)
    spool = monitor.spool_path or getattr(sink, "spool_path", None)
    url = None
    if target and reachable(target, timeout):
        url = run_view_url(target, hello["run_id"], int(hello.get("rank", 0)), token)
    return View(
        run=str(hello.get("run", "run")),
        url=url,
        spool=None if spool is None else os.fspath(spool),
        server=None if target is None else ws_base(target),
        height=height,
    )


def show(run_or_monitor: Any, server: str | None = None, view_token: str | None = None,
         height: int = 640) -> None:
    """Show a run in the notebook: the live view, or where its records are.

    ``run_or_monitor`` is a :class:`~gradwatch.trainer_hooks.Monitor` or a run id
    (then ``server``, default ``http://127.0.0.1:8765``, says where). In IPython the
    view is displayed; elsewhere its text is printed. :func:`view_of` returns it.

    Example:
        >>> import gradwatch.notebook as gn                  # doctest: +SKIP
        >>> gn.show(monitor)                                 # doctest: +SKIP
        >>> gn.show("3f2a...", server="http://127.0.0.1:8765")  # doctest: +SKIP
    """
    view = view_of(run_or_monitor, server=server, view_token=view_token, height=height)
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:
        print(view)
        return
    if get_ipython() is None:
        print(view)
    else:
        display(view)  # type: ignore[no-untyped-call]
