"""Serving the console's static files from the API's FastAPI app."""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

#: index.html, console.css and one ES module per page; shipped inside the package.
STATIC_DIR = Path(__file__).parent / "static"


class _Revalidated(StaticFiles):
    """Static files the browser must revalidate (a cheap 304) before use, so an upgraded server never
    runs against modules cached from the previous version."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers["Cache-Control"] = "no-cache"
        return response


def mount_console(app: FastAPI) -> None:
    """Serve the console at `/console/` (index.html is the single-page entry; pages are hash routes)
    and redirect `/` and `/console` to it."""

    def to_console() -> RedirectResponse:
        return RedirectResponse("/console/", status_code=307)

    app.add_api_route("/", to_console, methods=["GET"], include_in_schema=False)
    app.add_api_route("/console", to_console, methods=["GET"], include_in_schema=False)
    app.mount("/console", _Revalidated(directory=STATIC_DIR, html=True), name="console")
