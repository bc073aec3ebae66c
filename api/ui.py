"""The web UI and the offline API docs, served by `autopar serve` next to the JSON API.

- `GET /` and `GET /ui/...`: one HTML shell (`api/static/index.html`); `api/static/app.js` reads the
  path and draws the page from the JSON API (`/v1/plans`, `/v1/plans/{id}`, `/v1/plans/{id}/profiles`,
  `/v1/runs`, `/v1/clusters/{name}/calibration`). Pages: the plan list (`/`, `/ui/plans`), a plan
  (`/ui/plans/{id}`), a comparison (`/ui/compare?ids=1,2`), runs (`/ui/runs`, `/ui/runs/{id}`) and a
  cluster's calibration (`/ui/calibration/{cluster}`).
- `GET /static/...`: the UI's own files and the vendored libraries (`api/static/vendor/README.md`:
  Chart.js and swagger-ui-dist, pinned, with their licences). Nothing is loaded from a CDN.
- `GET /docs`: Swagger UI on the vendored bundle (FastAPI's `get_swagger_ui_html` with local URLs).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from planner.exporters import formats

STATIC_DIR = Path(__file__).resolve().parent / "static"
SWAGGER = "/static/vendor/swagger-ui"


def _shell() -> str:
    """index.html with the export formats the server knows, as a data attribute the page reads."""
    page = (STATIC_DIR / "index.html").read_text()
    config = html.escape(json.dumps({"export_formats": list(formats())}), quote=True)
    return page.replace("__AUTOPAR_CONFIG__", config)


def install_ui(app: FastAPI) -> None:
    """Mount the static files and add the UI and docs routes (kept out of the OpenAPI schema)."""
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    shell = _shell()

    @app.get("/", include_in_schema=False, response_class=HTMLResponse)
    def index() -> HTMLResponse:
        return HTMLResponse(shell)

    @app.get("/ui/{page:path}", include_in_schema=False, response_class=HTMLResponse)
    def ui_page(page: str) -> HTMLResponse:
        return HTMLResponse(shell)

    @app.get("/docs", include_in_schema=False, response_class=HTMLResponse)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} API",
            swagger_js_url=f"{SWAGGER}/swagger-ui-bundle.js", swagger_css_url=f"{SWAGGER}/swagger-ui.css",
            swagger_favicon_url=f"{SWAGGER}/favicon-32x32.png",
        )
