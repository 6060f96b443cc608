"""What a connection may cost the server: deadlines for the request head and an idle
keep-alive and a cap on open connections, added to uvicorn's h11 protocol."""

from __future__ import annotations

import logging
import re
import time
from typing import NoReturn

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .connection_limits import SPARE_FDS, ConnectionLimits
from .errors import TYPES
from .flow import HeldFlow, LingeringTransport, unparsed
from .metrics import Metrics
from .refusals import (
    CHUNK_BYTES,
    FREE_CHUNKS,
    HEAD_SLOW,
    HEAD_TIMEOUT,
    HEAD_TOO_LARGE,
    INVALID_HTTP,
    MAX_HEAD,
    NOT_HTTP,
    REFUSED,
    closing_reply,
    head_size,
    http10_framing,
    origin_form,
)

log = logging.getLogger("mlxbatch.serve")
LINGER_S = 2.0  # how long a refused client may go on sending before the socket closes
NON_BLANK = re.compile(rb"[^ \t\r\n]")
ANSWERED = "mlxbatch.answered"  # set in a request's scope when the protocol replied for it


class GuardedProtocol(H11Protocol):
    """uvicorn's h11 protocol with the head deadline, the connection cap and a lingering close.
    A server uses the subclass `guarded_protocol` makes: its limits, metrics and counters."""

    limits: ConnectionLimits
    metrics: Metrics
    refused_logged = 0.0  # when the cap was last logged: one line a minute, not a flood
    refused_lingering = 0  # refused sockets still open: a flood must not pile them up
    drain_ends: float | None = None  # the loop's time a drain drops the clients not reading

    def connection_made(self, transport) -> None:
        self.head_timer = self.linger_timer = self.reply_timer = None
        self.lingering = self.refused = self.heard = False
        self.raw = transport  # the socket's own transport (closes at once)
        if len(self.connections) >= self.limits.max_connections:
            self.refuse(transport)
            return
        super().connection_made(LingeringTransport(transport, self))
        self.flow = HeldFlow(self.flow, self.conn)  # the cycles take this one
        self.chunks = self.chunk_bytes = 0
        self.refusal = None  # why the protocol refuses the request, if it does
        self.refusal_status = 400  # and with which status
        self.parse_next, self.conn.next_event = self.conn.next_event, self.next_event
        self.await_head()

    def next_event(self):
        """h11's next event, an absolute-form target read as its path; a head too large: 431."""
        in_head = self.conn.their_state is h11.IDLE  # (an error turns it to ERROR)
        try:
            event = self.parse_next()
        except h11.RemoteProtocolError as e:  # 431 also for a chunk line or trailers too long
            if e.error_status_hint == 431 and in_head:
                self.refusal, self.refusal_status = HEAD_TOO_LARGE, 431
            raise
        if type(event) is h11.Request:
            return self.routable(event)
        if type(event) is h11.Data:
            self.count_chunk(event)
        return event

    def routable(self, event: h11.Request) -> h11.Request:
        """The request with its target as a path; refused unless HTTP/1.x to a path or URL."""
        self.chunks = self.chunk_bytes = 0
        if head_size(event) > MAX_HEAD:
            self.refusal_status = 431
            self.refuse_request(HEAD_TOO_LARGE)
        if event.http_version not in (b"1.0", b"1.1"):
            self.refuse_request(f"HTTP/{event.http_version.decode()} is not served here")
        target = origin_form(event.target)
        if target is None:
            self.refuse_request("the request target is neither a path nor an http(s) URL")
        if refusal := http10_framing(event):
            self.refusal_status = refusal[0]
            self.refuse_request(refusal[1])
        if target == event.target:
            return event
        # read here, once: uvicorn's scope, the routes and the access log see the path
        return h11.Request(
            method=event.method,
            headers=event.headers,
            target=target,
            http_version=event.http_version,
        )

    def count_chunk(self, event: h11.Data) -> None:
        """Refuse a body that comes in more and smaller chunks than it may. A chunk is
        counted at its end: a chunk's size line read alone loses h11's chunk_start."""
        self.chunk_bytes += len(event.data)
        self.chunks += int(event.chunk_end)
        if self.chunks > FREE_CHUNKS and self.chunk_bytes < self.chunks * CHUNK_BYTES:
            self.refuse_request(
                f"the body came in {self.chunks:,} chunks of "
                f"{self.chunk_bytes / self.chunks:.0f} bytes on average; "
                f"send it with Content-Length, or in chunks of at least "
                f"{CHUNK_BYTES} bytes"
            )

    def refuse_request(self, message: str) -> NoReturn:
        """Raise h11's parse error: uvicorn's `send_400_response` then answers `message`."""
        self.refusal = message
        raise h11.RemoteProtocolError(message)

    def refuse(self, transport) -> None:
        # not in uvicorn's connections: never shut down, waited for or counted
        self.refused = True
        self.metrics.connections_refused.inc()
        now, guarded = time.monotonic(), type(self)
        if now - guarded.refused_logged > 60:
            guarded.refused_logged = now
            log.warning(
                "%d connections open (--max-connections): refusing new ones", len(self.connections)
            )
        transport.write(REFUSED)
        if guarded.refused_lingering < SPARE_FDS // 2:
            guarded.refused_lingering += 1
            self.linger()
        else:  # the client may see a reset instead of the 503; no descriptor is held
            transport.close()

    def connection_lost(self, exc) -> None:
        if not self.refused:
            super().connection_lost(exc)
        elif self.lingering:
            type(self).refused_lingering -= 1
        for timer in (self.head_timer, self.linger_timer, self.reply_timer):
            if timer is not None:
                timer.cancel()

    def pause_writing(self) -> None:
        """The client is not reading: past `reply_s` it is dropped, freeing its connection slot."""
        super().pause_writing()
        if self.reply_timer is None:
            self.reply_timer = self.loop.call_later(self.reply_delay(), self.reply_late)

    def reply_delay(self) -> float:
        """`reply_s`, or what is left of a drain once one began (dropped here, with a log line)."""
        if self.drain_ends is None:
            return self.limits.reply_s
        return max(0.0, min(self.limits.reply_s, self.drain_ends - self.loop.time()))

    @classmethod
    def draining(cls, connections, ends: float) -> None:
        """A drain began (on the loop): the replies not being read get its deadline."""
        cls.drain_ends = ends
        for c in connections:
            if isinstance(c, GuardedProtocol) and c.reply_timer is not None:
                c.reply_timer.cancel()
                c.reply_timer = c.loop.call_later(c.reply_delay(), c.reply_late)

    def resume_writing(self) -> None:
        super().resume_writing()
        if self.reply_timer is not None:
            self.reply_timer.cancel()
            self.reply_timer = None

    def reply_late(self) -> None:
        self.reply_timer = None
        self.metrics.connections_dropped.inc()
        if self.drain_ends is not None and self.loop.time() >= self.drain_ends:
            log.info(
                "a client did not read its replies by the drain's end: its connection is dropped"
            )
        else:
            log.info(
                "a client did not read its replies for %g s: its connection is dropped",
                self.limits.reply_s,
            )
        self.raw.abort()  # what is buffered cannot be sent: close without flushing it

    def data_received(self, data: bytes) -> None:
        if self.lingering:  # the reply is sent: what still arrives is read and dropped
            return
        self.heard = True
        super().data_received(data)
        if self.flow.full():  # until the requests ahead of what it holds are answered
            self.flow.pause_reading()
            # uvicorn resumes the transport once past its own flow control, which still says paused
            self.transport.pause_reading()
        if self.cycle is not self.head_of and self.head_timer is not None:
            self.head_timer.cancel()  # a request head arrived: the body has its own deadline
            self.head_timer = None

    def on_response_complete(self) -> None:
        if self.conn.their_state is h11.SEND_BODY:  # answered before the body was in
            self.server_state.total_requests += 1
            self.linger()
            return
        super().on_response_complete()
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self.await_head()  # (a pipelined request may be running already)

    def await_head(self) -> None:
        # part of the next head may have come with the last request (pipelined): its
        # deadline runs from the reply, and keep-alive's idle close must not pass for it
        self.head_of, self.heard = self.cycle, NON_BLANK.search(unparsed(self.conn)) is not None
        if self.heard:
            self._unset_keepalive_if_required()
        if self.head_timer is not None:
            self.head_timer.cancel()
        self.head_timer = self.loop.call_later(self.limits.header_s, self.head_late)

    def head_late(self) -> None:
        self.head_timer = None
        if self.cycle is not self.head_of or self.transport.is_closing() or self.lingering:
            return  # (a lingering socket is half-closed: answered already)
        if not self.heard:  # an idle socket just closes
            self.transport.close()
            return
        self.metrics.request("timeout", 408)  # part of a head: say why, as any refusal
        self.log_refusal(408, HEAD_SLOW)
        self.transport.write(HEAD_TIMEOUT)
        # closed with a trickled head unread, the socket would reset before the 408 is read
        self.linger()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's reply to bytes h11 cannot parse, in the service's error shape, counted once."""
        status = getattr(self, "refusal_status", 400)
        self.metrics.request(TYPES[status], status)
        if self.cycle is not None and not self.cycle.response_complete:
            # end the app's wait for the body now, or a drain or deadline would count it twice
            self.cycle.scope[ANSWERED] = True
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        refusal = getattr(self, "refusal", None)
        # replaces uvicorn's bare "Invalid HTTP request received." (server.UvicornNoise drops it)
        self.log_refusal(status, refusal or NOT_HTTP)
        self.transport.write(INVALID_HTTP if refusal is None else closing_reply(status, refusal))
        # closing with the client's bytes unread would reset the connection, reply and all
        self.linger()

    def log_refusal(self, status: int, reason: str) -> None:
        """One line for a request refused below the app: the client and why."""
        host, port = self.client or ("?", 0)
        log.info("%s:%s - refused %d: %s", host, port, status, reason)

    def linger(self) -> None:
        """Half-close, then drop what the client still sends until its EOF or LINGER_S pass."""
        if self.lingering:
            return
        self.lingering = True
        if self.head_timer is not None:  # a refused head: no request will cancel it
            self.head_timer.cancel()
            self.head_timer = None
        if not self.refused:
            self.flow.release()
        if self.raw.can_write_eof():
            self.raw.write_eof()
        self.linger_timer = self.loop.call_later(LINGER_S, self.raw.close)

    def shutdown(self) -> None:
        if not self.lingering:
            super().shutdown()


def guarded_protocol(limits: ConnectionLimits, metrics: Metrics) -> type[GuardedProtocol]:
    """The protocol class one server runs: its own limits, metrics and refusal counters."""
    return type(
        "GuardedProtocol",
        (GuardedProtocol,),
        {"limits": limits, "metrics": metrics, "refused_logged": 0.0, "refused_lingering": 0},
    )
