"""The FastAPI application: ``create_app(settings)``.

Example:
    >>> from gradwatch.server.app import create_app
    >>> from gradwatch.server.settings import Settings
    >>> app = create_app(Settings(db="/tmp/gradwatch-doc.db"))
    >>> "/ws/ingest" in {getattr(route, "path", None) for route in app.routes}
    True

Run it with uvicorn (``gradwatch serve`` does this), e.g.
``uvicorn.run(create_app(settings), host="127.0.0.1", port=8765)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.types import Scope

from .api import require_viewer, router, version
from .depth_api import depth_router
from .ingest import ingest_endpoint
from .metrics import metrics_router
from .security import SecurityMiddleware, cookie_secure, token_cookie
from .settings import Settings
from .state import AppState
from .store import Store, open_store
from .viewers import live_endpoint


def client_dir() -> Path:
    """The dashboard's files (the ``gradwatch.client`` package)."""
    return Path(str(resources.files("gradwatch.client")))


def plotly_js() -> Path:
    """Plotly.js as the installed ``plotly`` package ships it (no CDN)."""
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _first_error(error: RequestValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()) if p != "query")
    if first.get("type") == "missing":  # pydantic's "Field required", got None
        return f"{where}: expected a value (a required parameter), got none"[:300]
    msg = str(first.get("msg", "invalid")).removeprefix("Input should be ")
    return f"{where}: expected {msg}, got {first.get('input')!r}"[:300]


class ClientFiles(StaticFiles):
    """The dashboard's files, without the Python package's own (``__init__.py``...)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        name = path.replace("\\", "/").rsplit("/", 1)[-1]
        if name == "py.typed" or name.endswith((".py", ".pyc")) or "__pycache__" in path:
            raise HTTPException(404, "expected a dashboard file, got a Python package file")
        return await super().get_response(path, scope)


def create_app(settings: Settings, store: Store | None = None) -> FastAPI:
    """The server as an ASGI app; the store opens at startup unless one is given.

    The app refuses nothing by itself: ``gradwatch serve`` refuses an unsafe bind.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        own = store is None
        opened = await asyncio.to_thread(open_store, settings) if own else store
        assert opened is not None
        state = AppState(settings, opened)
        app.state.gradwatch = state
        feed = None
        if opened.kind == "postgresql":
            # Replicas on one PostgreSQL see each other's batches live (docs/DEPLOY.md).
            from .replicas import ReplicaFeed
            from .store.postgres import PostgresStore

            assert isinstance(opened, PostgresStore)
            feed = ReplicaFeed(state, opened)
            try:
                await feed.start()
            except BaseException:
                await feed.stop()
                if own:
                    await asyncio.to_thread(opened.close)
                raise
        state.replicas = feed
        # pushes every status change to viewers: live, stalled, stale, finished, crashed
        statuses = asyncio.create_task(state.statuses.run())
        try:
            yield
        finally:
            statuses.cancel()
            if feed is not None:
                await feed.stop()
            if own:
                await asyncio.to_thread(opened.close)

    app = FastAPI(
        title="gradwatch",
        version=version(),
        summary="Live gradient-flow monitor: ingest, history and live views (docs/API.md)",
        lifespan=lifespan,
        # The interactive docs load their scripts from a CDN and inline code, which the
        # pages' Content-Security-Policy (and an offline GPU box) forbid. The schema stays.
        docs_url=None,
        redoc_url=None,
    )

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _first_error(error)}, status_code=422)

    app.include_router(router)
    app.include_router(depth_router)
    app.include_router(metrics_router(require_viewer))
    app.add_api_websocket_route("/ws/ingest", ingest_endpoint)
    app.add_api_websocket_route("/ws/live", live_endpoint)

    if settings.serve_client:
        client = client_dir()

        @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
        async def index(request: Request) -> Response:
            try:
                require_viewer(request)
            except Exception:
                return Response(
                    "gradwatch: this dashboard needs the link with its ?token=\n",
                    status_code=401,
                    media_type="text/plain; charset=utf-8",
                )
            page = FileResponse(client / "index.html", media_type="text/html; charset=utf-8")
            opened_with = request.query_params.get("token")
            if opened_with:
                # The page strips ?token= from its address (history.replaceState) and
                # sends REST requests with Authorization: Bearer; its websockets carry
                # this cookie instead of a token in their URL (docs/API.md).
                page.set_cookie(
                    token_cookie(request.headers.get("host")), opened_with, httponly=True,
                    samesite="strict", path="/",
                    secure=cookie_secure(request.url.scheme,
                                         request.headers.get("x-forwarded-proto"),
                                         settings.public_url),
                )
            return page

        @app.get("/static/vendor/plotly.min.js", include_in_schema=False)
        async def plotly_bundle() -> FileResponse:
            return FileResponse(plotly_js(), media_type="text/javascript; charset=utf-8")

        app.mount("/static", ClientFiles(directory=client), name="static")

    app.add_middleware(SecurityMiddleware, settings=settings)
    return app
