"""Running the app under uvicorn: the port bound before anything loads, connections under their
deadlines, SIGTERM and Ctrl-C drain (exit 0, 130), and a model that fails to load stops it."""

from __future__ import annotations

import asyncio
import logging
import signal
import socket

import uvicorn

from ..errors import UsageError
from .app import build_app
from .connection_limits import ConnectionLimits
from .connections import guarded_protocol
from .service import Service

LOOPBACK = ("127.0.0.1", "localhost", "::1")
BACKLOG = 2048  # uvicorn's default
# how long before uvicorn cancels what is still running (at --drain-timeout) the clients not
# reading their replies are dropped: uvicorn's own count starts up to a tick (0.1 s) later
DRAIN_MARGIN_S = 0.5


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the service to refuse new work the moment a signal arrives."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service, self.signals = service, []

    def handle_exit(self, sig, frame) -> None:
        if not self.signals:
            try:  # in the signal handler: the loop takes it at its next turn
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if loop is not None:
                drain_s = self.config.timeout_graceful_shutdown or 0.0  # --drain-timeout
                ends = loop.time() + max(0.0, drain_s - DRAIN_MARGIN_S)
                loop.call_soon_threadsafe(
                    self.config.http_protocol_class.draining, self.server_state.connections, ends
                )
        self.signals.append(sig)
        self.service.drain()
        super().handle_exit(sig, frame)


class PathOnly(logging.Filter):
    """The access log's path without its query string, where a key or text could be."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and len(record.args) == 5:
            client, method, path, version, status = record.args
            record.args = (client, method, str(path).split("?", 1)[0], version, status)
        return True


class DrainEnded(logging.Filter):
    """uvicorn's ERROR on cancelling what a drain did not finish, said as the warning it is."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and "timeout graceful shutdown" in record.getMessage():
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


class UvicornNoise(logging.Filter):
    """Drops uvicorn's lines that name neither client nor reason (GuardedProtocol logs its own)."""

    NOISE = (
        "Invalid HTTP request received.",
        "Unsupported upgrade request.",
        "No supported WebSocket library detected.",
    )

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.NOISE)


def listen(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a port in use is one line."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as e:
        raise UsageError(f"--host {host}: cannot listen there ({e.strerror or e})") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def serve(
    service: Service,
    sock: socket.socket,
    api_key: bytes | None,
    limits: ConnectionLimits,
    log_level: str = "info",
) -> int:
    """Serve on `sock` until SIGTERM (0) or Ctrl-C (130); 2 when the model failed to load."""
    logging.getLogger("mlxbatch.serve").setLevel(log_level.upper())
    if not logging.getLogger("mlxbatch.serve").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logging.getLogger("mlxbatch.serve").addHandler(handler)
    config = uvicorn.Config(
        build_app(service, api_key, limits),
        log_level=log_level,
        server_header=False,
        http=guarded_protocol(limits, service.metrics),
        timeout_keep_alive=limits.keep_alive_s,
        timeout_graceful_shutdown=limits.drain_s,
        ws="none",  # `Upgrade: websocket` would leave GuardedProtocol where a library is installed
    )
    logging.getLogger("uvicorn.access").addFilter(PathOnly())
    logging.getLogger("uvicorn.error").addFilter(DrainEnded())
    logging.getLogger("uvicorn.error").addFilter(UvicornNoise())
    host, port = sock.getsockname()[:2]  # uvicorn's own line is not printed for a given socket
    logging.getLogger("mlxbatch.serve").info(
        "listening on http://%s:%d", f"[{host}]" if ":" in host else host, port
    )
    server = DrainingServer(config, service)

    def stop() -> None:
        server.should_exit = True

    service.on_failed = stop
    # uvicorn re-raises the signal it caught once it has shut down; handlers of our own make
    # that a no-op, so the exit code says which signal drained the server.
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        service.close(drain=False)  # a no-op after the drain; a second Ctrl-C skips it
    if service.state == "failed":
        return 2
    return 130 if signal.SIGINT in server.signals else 0
