"""uvicorn's transport and flow control for one connection, wrapped: a close that lingers while
the client still sends, and reading held while h11 holds too many unparsed bytes."""

from __future__ import annotations

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# unparsed bytes a connection may hold (requests pipelined behind the one being answered):
# past them reading pauses; above a head's most (refusals.MAX_HEAD) and one socket read (256 KiB)
PIPELINED_BYTES = 1 << 20


class LingeringTransport:
    """The connection's transport, lingering instead of closing while the client is still sending
    its body: a socket closed with unread bytes sends a reset, and the client never sees the 413."""

    def __init__(self, transport, protocol: H11Protocol):
        self.raw, self.protocol = transport, protocol

    def close(self) -> None:
        if self.protocol.conn.their_state is h11.SEND_BODY:
            self.protocol.linger()
        else:
            self.raw.close()

    def __getattr__(self, name: str):
        return getattr(self.raw, name)


def unparsed(conn: h11.Connection) -> bytes | bytearray:
    """The bytes h11 has received and not parsed yet, without `trailing_data`'s copy."""
    data = getattr(getattr(conn, "_receive_buffer", None), "_data", None)
    return data if isinstance(data, bytearray) else conn.trailing_data[0]


class HeldFlow:
    """uvicorn's flow control, reading kept paused while h11 holds over PIPELINED_BYTES unparsed."""

    def __init__(self, flow, conn: h11.Connection):
        self.flow, self.conn = flow, conn

    def full(self) -> bool:
        return len(unparsed(self.conn)) > PIPELINED_BYTES

    def resume_reading(self) -> None:
        if not self.full():
            self.flow.resume_reading()

    def release(self) -> None:
        """Reading resumed whatever is held (a lingering close reads and drops)."""
        self.flow.resume_reading()

    def __getattr__(self, name: str):
        return getattr(self.flow, name)
