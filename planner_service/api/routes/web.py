"""The web page: GET / (planner_service/web/index.html) and its assets under /static/.

The page is plain HTML, CSS and JavaScript shipped as package data (no build step, nothing
fetched from elsewhere); it talks to the same /v1 API as every other client.  Only the files
listed in ``ASSETS`` are served, so no request path reaches the file system.  The list of launch
targets is written into the page from :data:`planner_service.exporters.TARGETS`, so the page
offers exactly the targets the server can render, and what each training framework can run
from :func:`cost_model.frameworks.describe`, so its hint is the rule table the search applies.
"""

from __future__ import annotations

import hashlib
import html
import json
from functools import cache
from importlib import resources

from fastapi import APIRouter, Request, Response
from fastapi.responses import HTMLResponse

from cost_model.frameworks import RULES, describe
from planner_service.exporters import TARGETS
from planner_service.storage.errors import NotFound

router = APIRouter(tags=["web"], include_in_schema=False)

#: Served asset → content type.
ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}

#: The page loads only its own script and stylesheet and talks only to this origin.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

_TARGETS_PLACEHOLDER = "__LAUNCH_TARGETS__"
_FRAMEWORKS_PLACEHOLDER = "__FRAMEWORKS__"


def _read(name: str) -> bytes:
    return (resources.files("planner_service") / "web" / name).read_bytes()


def _respond(request: Request, body: bytes, media_type: str, headers: dict[str, str] | None = None) -> Response:
    """The body with a strong ETag; 304 when the browser already has it.  ``no-cache`` makes
    the browser revalidate on every load, so a new release is picked up at once."""
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    common = {"ETag": etag, "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", **(headers or {})}
    if etag in [t.strip() for t in request.headers.get("if-none-match", "").split(",")]:
        return Response(status_code=304, headers=common)
    return Response(body, media_type=media_type, headers=common)


@cache
def _index_page() -> bytes:
    """index.html with the launch targets and the frameworks' hints written in: fixed for the
    life of the process, so rendered once, not on every request."""
    page = _read("index.html").decode("utf-8")
    page = page.replace(_TARGETS_PLACEHOLDER, html.escape(",".join(TARGETS), quote=True))
    page = page.replace(_FRAMEWORKS_PLACEHOLDER, html.escape(json.dumps({f: describe(f) for f in RULES}), quote=True))
    return page.encode("utf-8")


@router.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse, summary="The web page")
def index(request: Request) -> Response:
    return _respond(
        request,
        _index_page(),
        "text/html; charset=utf-8",
        {"Content-Security-Policy": CONTENT_SECURITY_POLICY, "Referrer-Policy": "no-referrer"},
    )


@router.api_route("/static/{name}", methods=["GET", "HEAD"], summary="A static asset of the web page")
def asset(name: str, request: Request) -> Response:
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no static file {name!r}", field="name")
    return _respond(request, _read(name), media_type)
