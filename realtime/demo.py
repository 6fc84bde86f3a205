"""The browser demo page at `/`: clients/web, shipped as package data of `clients`.

Found through the installed package (not the source tree), so a wheel serves the same
page as a checkout; a page that is not there stops the start-up (`--no-demo` skips it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles


def web_dir(package: str = "clients") -> Path:
    """The demo's folder inside the installed `package`, found without importing it
    (the service runs no client code)."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"the demo page needs the {package!r} package, which is not installed (or pass --no-demo)")
    return Path(spec.origin).parent / "web"


def demo_routes(web: Path) -> list[BaseRoute]:
    """`/` (the page) and `/static/*` (its scripts and style) from `web`; index() finds
    the page on `app.state.demo_page`."""
    if not (web / "index.html").is_file():
        raise RuntimeError(f"the demo page {web / 'index.html'} is missing: the package was installed without "
                           "its web files (pyproject package-data), or pass --no-demo")
    return [Route("/", index), Mount("/static", StaticFiles(directory=web), name="static")]


async def index(request: Request) -> Response:
    return FileResponse(request.app.state.demo_page)
