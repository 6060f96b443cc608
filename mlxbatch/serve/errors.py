"""The service's error replies, one JSON shape: `{"error": {"message", "type", "code"}}`."""

from __future__ import annotations

from starlette.responses import JSONResponse

TYPES = {
    400: "invalid_request",  # malformed JSON, a wrong shape, a bad field
    401: "unauthorized",  # --api-key-file set and no or a wrong key
    404: "not_found",  # an unknown route or model name
    405: "method_not_allowed",  # a known route, another method
    408: "timeout",  # the request head or body came too slowly (--timeout-header, -body)
    411: "length_required",  # an HTTP/1.0 body without Content-Length (it would be read as none)
    413: "too_large",  # over the body cap or --max-inputs-per-request
    422: "too_long",  # an item over --max-tokens without "truncate": true
    429: "queue_full",  # the scheduler's queue is full: retry after Retry-After seconds
    431: "headers_too_large",  # the request line and headers over h11's buffer (16 KB)
    503: "unavailable",  # starting (model loading) or draining (SIGTERM)
    500: "internal",
}


class ApiError(Exception):
    """A reply other than 200, raised anywhere below a route and rendered by `response`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}

    @property
    def type(self) -> str:
        return TYPES[self.status]

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "code": self.status}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)
