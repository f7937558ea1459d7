"""`/api/docs`: Swagger UI over the OpenAPI document, from files shipped with the installation.

Swagger UI's script and stylesheet come from the `fastapi-offline` package (which bundles them), the page
and its start-up script from `docs_static/`: no CDN, so the page works with no internet, and no inline
script, so it works under the Content-Security-Policy every answer carries.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Final

from fastapi import FastAPI
from fastapi.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_URL: Final = "/api/docs"
ASSETS_URL: Final = f"{DOCS_URL}/assets"
SWAGGER_UI_DIR: Final = Path(str(resources.files("fastapi_offline") / "static"))
OWN_DIR: Final = Path(__file__).parent / "docs_static"

_PAGE: Final = f"""<!doctype html>
<html lang="en">
<head>
  <meta charset="utf-8">
  <meta name="viewport" content="width=device-width, initial-scale=1">
  <title>ledgerflow API</title>
  <link rel="stylesheet" href="{ASSETS_URL}/swagger-ui/swagger-ui.css">
  <link rel="icon" href="{ASSETS_URL}/swagger-ui/favicon.png">
</head>
<body>
  <div id="swagger-ui"></div>
  <script src="{ASSETS_URL}/swagger-ui/swagger-ui-bundle.js"></script>
  <script src="{ASSETS_URL}/docs.js"></script>
</body>
</html>
"""


def mount_docs(app: FastAPI) -> None:
    """Serve the docs page at /api/docs and its assets under /api/docs/assets/."""

    def docs() -> HTMLResponse:
        return HTMLResponse(_PAGE)

    app.add_api_route(DOCS_URL, docs, methods=["GET"], include_in_schema=False)
    app.mount(f"{ASSETS_URL}/swagger-ui", StaticFiles(directory=SWAGGER_UI_DIR), name="docs-swagger-ui")
    app.mount(ASSETS_URL, StaticFiles(directory=OWN_DIR), name="docs-assets")
