"""Running the app under uvicorn: SIGTERM drains (503 for new requests, queued ones finish,
exit 0), and a model that fails to load stops the server."""

from __future__ import annotations

import logging
import signal

import uvicorn

from .app import build_app
from .service import Service

LOOPBACK = ("127.0.0.1", "localhost", "::1")


class DrainingServer(uvicorn.Server):
    """uvicorn's server, telling the service to refuse new work the moment a signal arrives
    (uvicorn itself notices it on its next 0.1 s tick and waits for in-flight requests)."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig, frame) -> None:
        self.service.drain()
        super().handle_exit(sig, frame)


def serve(service: Service, host: str = "127.0.0.1", port: int = 8765,
          api_key: bytes | None = None, log_level: str = "info") -> int:  # fmt: skip
    """Serve until SIGTERM or Ctrl-C; the exit code (0, or 2 when the model failed to load)."""
    logging.getLogger("mlxbatch.serve").setLevel(log_level.upper())
    if not logging.getLogger("mlxbatch.serve").handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))
        logging.getLogger("mlxbatch.serve").addHandler(handler)
    config = uvicorn.Config(build_app(service, api_key), host=host, port=port,
                            log_level=log_level, timeout_graceful_shutdown=None,
                            server_header=False)  # fmt: skip
    server = DrainingServer(config, service)

    def stop() -> None:
        server.should_exit = True

    service.on_failed = stop
    # uvicorn re-raises the signal it caught once it has shut down; a handler of our own
    # makes that a no-op, so a drained SIGTERM exits 0 instead of dying by the signal.
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 2 if service.state == "failed" else 0
