"""`/docs`: Swagger UI served from the gateway itself, so the API browser works offline.

FastAPI's default page loads Swagger UI's script, stylesheet and icon from a CDN, which a phone on a
closed network or a cluster without internet egress cannot reach. The same page is built here with
FastAPI's `get_swagger_ui_html`, pointed at Swagger UI's assets as the pinned `fastapi-offline`
package ships them (Swagger UI 5, which renders the OpenAPI 3.1 document FastAPI writes; the
`swagger-ui-bundle` package still ships Swagger UI 4, which cannot), mounted under `ASSETS_PATH`.
Only the package's asset folder is used, not its application factory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
ASSET_NAMES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")


def swagger_assets_directory() -> Path:
    """The folder holding Swagger UI's `swagger-ui-bundle.js`, `swagger-ui.css` and `favicon.png`.
    Raises FileNotFoundError when the installed package lacks one of them."""
    directory = Path(str(resources.files("fastapi_offline") / "static"))
    missing = [name for name in ASSET_NAMES if not (directory / name).is_file()]
    if missing:
        raise FileNotFoundError(f"fastapi-offline's Swagger UI assets are missing: {', '.join(missing)}")
    return directory


def install(app: FastAPI) -> None:
    """Adds `GET /docs` (Swagger UI of `app.openapi_url`, no token needed, like the document) and
    the static assets under `ASSETS_PATH`. Create the app with `docs_url=None`. Both honour the
    ASGI `root_path`, so the page also works behind a path-prefixing proxy."""
    app.mount(ASSETS_PATH, StaticFiles(directory=swagger_assets_directory()), name="swagger-ui-assets")
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root_path = str(request.scope.get("root_path") or "")
        return get_swagger_ui_html(
            openapi_url=f"{root_path}{openapi_url}",
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root_path}{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{root_path}{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{root_path}{ASSETS_PATH}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )
