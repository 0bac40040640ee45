"""``monarch dashboard``'s web app (Starlette, served by uvicorn).

Routes: ``/`` the page (``templates/index.html``), ``/static/plotly.min.js``
(the copy inside the installed ``plotly`` package: the page needs no
internet), ``/api/model`` (the model's view plus its history, what the page
redraws from every interval) and ``/api/history`` (the history alone). The
poller runs on the server's own event loop for as long as the app lives.
Nothing secret reaches the page: the model holds what procs answer, never
the broker's URL or credentials.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from monarch.cli.watch.model import WatchModel
from monarch.cli.watch.poller import Poller

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
RETRY_CONNECT = 2.0  # seconds between tries while the broker cannot be reached


def plotly_js() -> Path:
    """The installed plotly package's own plotly.min.js."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


async def _poll_forever(connect: Callable[[], Awaitable[Any]], model: WatchModel) -> None:
    while True:
        try:
            nc = await connect()
        except ConnectionError:
            model.connected = False  # the page says "broker unreachable"; try again
            await asyncio.sleep(RETRY_CONNECT)
            continue
        try:
            async with Poller(nc, model) as poller:
                await poller.run()
        finally:
            with contextlib.suppress(Exception):
                await nc.close()


def create_app(connect: Callable[[], Awaitable[Any]], model: WatchModel) -> Starlette:
    """The dashboard over ``model``, fed through connections ``connect()`` opens."""

    async def page(request: Request) -> Response:
        context = {"namespace": model.namespace, "interval_ms": int(model.interval * 1000)}
        return TEMPLATES.TemplateResponse(request, "index.html", context)

    async def plotly(request: Request) -> Response:
        return FileResponse(plotly_js(), media_type="text/javascript")

    async def api_model(request: Request) -> Response:
        return JSONResponse({**model.view(), "history": model.history()})

    async def api_history(request: Request) -> Response:
        return JSONResponse(model.history())

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(_poll_forever(connect, model))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    routes = [
        Route("/", page),
        Route("/static/plotly.min.js", plotly),
        Route("/api/model", api_model),
        Route("/api/history", api_history),
    ]
    return Starlette(routes=routes, lifespan=lifespan)
