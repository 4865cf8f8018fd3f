"""The dashboard's Starlette app: studies, live pages, JSON and assets; read-only, a set token guards every request."""

import contextlib
import hmac
import logging
import re
import threading
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from rlscale.base.errors import UserError
from rlscale.base.names import NAME_PATTERN
from rlscale.dashboard.study import StudyView
from rlscale.views.page import ASSETS, asset, render_index, render_study_page

COOKIE = "rlscale_dashboard"
HEADERS = {
    # only this server's own scripts and styles; charts are canvas, report PNGs data URIs
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # a token in a URL never leaves in a Referer header
}
log = logging.getLogger("rlscale.dashboard")


class Dashboard:
    """The store (opened read-only on first use, again after it failed) and one StudyView per study."""

    def __init__(self, url: str | None, db: str | None = None):
        self.url, self.db = url, db
        self._store = None
        self._views: dict[str, StudyView] = {}
        self._lock = threading.Lock()

    def store(self):
        """The open read-only store; UserError while it cannot be opened (not created yet, unreachable)."""
        from rlscale.db.store import Store

        with self._lock:
            if self._store is None:
                self._store = Store(self.url, read_only=True)
            return self._store

    def view(self, study: str) -> StudyView:
        with self._lock:
            return self._views.setdefault(study, StudyView(study, self.db))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()


def create_app(url: str | None = None, *, token: str | None = None, db: str | None = None) -> Starlette:
    """The app over `url` (None: RLSCALE_DB); a set `token` guards each request (?token= once, a cookie, or Bearer)."""
    dashboard = Dashboard(url, db)

    def index(request: Request) -> Response:
        try:
            store = dashboard.store()
            return HTMLResponse(render_index(store.study_counts(), store=store.url_for_display))
        except UserError as err:
            return HTMLResponse(render_index([], error=str(err)), status_code=503)

    def study_page(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            stamp, page = dashboard.view(name).refresh(dashboard.store())
        except UserError as err:
            return HTMLResponse(render_index([], error=str(err)), status_code=_status(err))
        return HTMLResponse(
            render_study_page(page, live_url=f"../api/study/{name}", stamp=stamp, assets_href="../assets/")
        )

    def study_json(request: Request) -> Response:
        name = request.path_params["name"]
        view = dashboard.view(name)
        try:
            stamp, _page = view.refresh(dashboard.store())
        except UserError as err:
            return JSONResponse({"error": str(err)}, status_code=_status(err), headers={"Cache-Control": "no-store"})
        since = request.query_params.get("since")
        if since == stamp:
            return JSONResponse({"changed": False, "stamp": stamp}, headers={"Cache-Control": "no-store"})
        # only what changed since the page's stamp: a new evaluation of one run sends that run
        return JSONResponse({"changed": True, **view.changes(since)}, headers={"Cache-Control": "no-store"})

    def assets(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS:  # a fixed list of names: no path is ever built from the request
            return PlainTextResponse("not found", status_code=404)
        return Response(asset(name), media_type=ASSETS[name], headers={"Cache-Control": "max-age=3600"})

    # study names are file-safe words (rlscale.base.names); anything else is not a study
    name = "{name:str}"
    routes = [
        Route("/", index),
        Route(f"/study/{name}", study_page),
        Route(f"/api/study/{name}", study_json),
        Route("/assets/{name:str}", assets),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        yield
        dashboard.close()

    # a study of hundreds of runs is a few hundred KB of JSON: sent gzipped to browsers that take it
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(GZipMiddleware, minimum_size=1024)])
    app.state.dashboard = dashboard
    return _Guard(app, token)


def _status(err: UserError) -> int:
    return 404 if str(err).startswith("no study named") or "expected a study name" in str(err) else 503


class _Guard:
    def __init__(self, app, token: str | None):
        self.app, self.token = app, token
        self.state = app.state
        self._name = re.compile(NAME_PATTERN)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request = Request(scope)
        response = self._refusal(request)
        if response is not None:
            return await response(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                message["headers"] = list(message.get("headers", [])) + [
                    (key.lower().encode(), value.encode()) for key, value in HEADERS.items()
                ]
            await send(message)

        await self.app(scope, receive, with_headers)

    def _refusal(self, request: Request) -> Response | None:
        parts = request.url.path.split("/")
        if len(parts) >= 3 and parts[-2] == "study" and not self._name.match(parts[-1]):
            return _secured(PlainTextResponse("not a study name", status_code=404))
        if self.token is None:
            return None
        given = request.query_params.get("token")
        if given is not None:
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _secured(PlainTextResponse("wrong token", status_code=401))
            # the token moves into a cookie, and the address bar loses it
            rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
            response = RedirectResponse(request.url.path + (f"?{rest}" if rest else ""), status_code=303)
            response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
            return _secured(response)
        bearer = request.headers.get("authorization", "").removeprefix("Bearer ").strip()
        for candidate in (request.cookies.get(COOKIE, ""), bearer):
            if candidate and hmac.compare_digest(candidate.encode(), self.token.encode()):
                return None
        return _secured(
            PlainTextResponse(
                "this dashboard needs its token: open the address it printed (...?token=...)", status_code=401
            )
        )


def _secured(response: Response) -> Response:
    response.headers.update(HEADERS)
    return response
