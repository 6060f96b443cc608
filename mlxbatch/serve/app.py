"""The HTTP routes (Starlette): /v1/classify, /v1/models, /health, /metrics. Routes only read,
validate and await; work runs in threads, never on the event loop; texts are never logged."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import Coroutine
from contextlib import asynccontextmanager
from urllib.parse import unquote

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .connection_limits import ConnectionLimits
from .connections import ANSWERED
from .errors import TYPES, ApiError
from .limits import CLOSE, parse_body, read_body
from .service import Service

log = logging.getLogger("mlxbatch.serve")
ENCODED_SLASH = re.compile(rb"%2f", re.IGNORECASE)


def check_key(request: Request, key: bytes | None) -> None:
    """401 unless `Authorization: Bearer <key>`, compared as the bytes sent, in constant time."""
    if key is None:
        return
    given = [v for k, v in request.scope["headers"] if k == b"authorization"]
    if len(given) > 1:  # which one counts would be a guess
        raise ApiError(
            401, "send one Authorization header, not several", {"WWW-Authenticate": "Bearer"}
        )
    scheme, _, token = (given or [b""])[0].partition(b" ")
    if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), key):
        raise ApiError(
            401,
            "a valid API key is required: send 'Authorization: Bearer <key>'",
            {"WWW-Authenticate": "Bearer"},
        )


async def unless_gone(request: Request, work: Coroutine):
    """`work`'s result, or None (and `work` cancelled) as soon as the client has gone."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return task.result() if not task.cancelled() else None


async def _disconnected(request: Request) -> None:
    """Return once the client is gone (the body is read: only a disconnect comes now)."""
    while (await request.receive())["type"] != "http.disconnect":
        await asyncio.sleep(0)


class EncodedSlashes:
    """The app, routed on the path with its "%2F"s kept (uvicorn decodes the whole raw path)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        raw = scope.get("raw_path") or b""
        if scope["type"] == "http" and ENCODED_SLASH.search(raw):
            parts = ENCODED_SLASH.split(raw)  # h11 let only ASCII into the target
            # in place: uvicorn's access log reads this scope
            scope["path"] = "%2F".join(unquote(p.decode("ascii")) for p in parts)
        await self.app(scope, receive, send)


class Routes:
    """The routes over what they share: the service, the API key and the deadlines."""

    def __init__(self, service: Service, api_key: bytes | None, connections: ConnectionLimits):
        self.service, self.api_key, self.connections = service, api_key, connections
        self.metrics, self.limits = service.metrics, service.limits
        self.clocks: set[asyncio.Timeout] = set()  # the deadlines of the bodies being read
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's, set by the lifespan

    async def classify(self, request: Request) -> Response:
        service, metrics = self.service, self.metrics
        start, body = time.perf_counter(), None
        try:
            check_key(request, self.api_key)
            service.check_accepting()
            body = await read_body(
                request, self.limits.max_body_bytes, self.connections.body_s, self.clocks
            )
            parsed = await parse_body(body, self.limits, service.names)
            reply = await unless_gone(request, service.classify(parsed))
        except ApiError as e:
            if request.scope.get(ANSWERED):  # the protocol refused it (a 400, counted)
                return Response(status_code=400)
            if e.status == 408 and service.state == "draining":  # cut short by the drain
                e = ApiError(503, "the server is shutting down")
            metrics.request(e.type, e.status)
            log.info("classify: %d %s", e.status, e.type)
            if body is None:  # the body is not read: the connection cannot carry another
                e.headers = {**e.headers, **CLOSE}  # request, and the reply says so
            return e.response()
        except asyncio.CancelledError:  # uvicorn's --drain-timeout passed with it unscored
            if service.state != "draining":
                raise
            metrics.request("unavailable", 503)
            log.info("classify: 503 unavailable (not scored before the drain ended)")
            return ApiError(
                503,
                "the server is shutting down: this request was not scored "
                "before the drain ended (--drain-timeout, or a second Ctrl-C)",
            ).response()
        except ClientDisconnect:  # gone mid-body: nobody to answer
            if request.scope.get(ANSWERED):  # cut off by the protocol, its 400 counted
                return Response(status_code=400)
            metrics.request("disconnected", 499)
            log.info("classify: the client disconnected before sending its whole body")
            return Response(status_code=400)
        except Exception:  # a bug: log it (the traceback, never the texts), reply 500
            log.exception("classify failed")
            metrics.request("internal", 500)
            return ApiError(500, "internal error (see the server's log)").response()
        seconds = time.perf_counter() - start
        if reply is None or await request.is_disconnected():  # gone while it was scored
            metrics.request("disconnected", 499)
            log.info("classify: the client disconnected before its reply")
            return Response(status_code=499)
        metrics.request("ok", 200, seconds)
        log.debug("classify: 200, %d item(s) in %.1f ms", len(reply["data"]), seconds * 1e3)
        return JSONResponse(reply)

    async def models(self, request: Request) -> Response:
        service = self.service
        try:
            check_key(request, self.api_key)
            if service.state not in ("ready", "draining") or service.clf is None:
                service.check_accepting()
        except ApiError as e:
            self.metrics.request(e.type, e.status)
            return e.response()
        self.metrics.request("ok", 200)
        return JSONResponse(service.describe())

    async def health(self, request: Request) -> Response:
        status, body = self.service.health()
        return JSONResponse(body, status_code=status)

    async def prometheus(self, request: Request) -> Response:
        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    async def http_error(self, request: Request, exc: HTTPException) -> Response:
        status = exc.status_code if exc.status_code in TYPES else 400
        message = {
            404: f"no route {request.url.path}",
            405: f"{request.method} is not allowed on {request.url.path}",
        }
        error = ApiError(status, message.get(status, str(exc.detail)))
        if request.url.path.startswith("/v1/"):  # without the key, /v1/* tells nothing of
            try:  # its routes (a 404 or 405 named them)
                check_key(request, self.api_key)
            except ApiError as refused:
                error = refused
        self.metrics.request(error.type, error.status)
        return error.response()

    def cut_bodies(self) -> None:
        """On the loop: bodies still arriving when the drain starts end now (503)."""
        now = asyncio.get_running_loop().time()
        for clock in list(self.clocks):
            clock.reschedule(now)

    def cut_soon(self) -> None:
        """The drain hook: the drain starts in a signal handler, off the loop the clocks run on."""
        self.loop.call_soon_threadsafe(self.cut_bodies)

    @asynccontextmanager
    async def lifespan(self, app):
        self.loop = asyncio.get_running_loop()
        self.service.on_drain.append(self.cut_soon)
        self.service.start()
        try:
            yield
        except asyncio.CancelledError:  # a second Ctrl-C: uvicorn skips the shutdown and the
            return  # loop's end cancels this wait (a traceback in the log); serve() closes
        self.service.on_drain.remove(self.cut_soon)
        # what is still queued after the in-flight requests has nobody waiting for it
        await anyio.to_thread.run_sync(lambda: self.service.close(drain=False))


def build_app(service: Service, api_key: bytes | None, connections: ConnectionLimits) -> Starlette:
    """The app: `Routes` on their paths, its lifespan, and HTTP errors in our error shape."""
    routes = Routes(service, api_key, connections)
    app = Starlette(
        routes=[
            Route("/v1/classify", routes.classify, methods=["POST"]),
            Route("/classify", routes.classify, methods=["POST"]),  # vLLM's path too
            Route("/v1/models", routes.models, methods=["GET"]),
            Route("/health", routes.health, methods=["GET"]),
            Route("/metrics", routes.prometheus, methods=["GET"]),
        ],
        lifespan=routes.lifespan,
        middleware=[Middleware(EncodedSlashes)],
        exception_handlers={HTTPException: routes.http_error},
    )
    # no redirect to a Location built from the client's Host header: "/v1/classify/" is a 404
    app.router.redirect_slashes = False
    return app
