"""What a connection may do: its deadlines (head, body, keep-alive, an unread reply), the cap on
open connections, the drain's length, and the open-files limit the cap needs."""

from __future__ import annotations

import resource
from dataclasses import dataclass

SPARE_FDS = 128  # descriptors beyond the connections: the model's files, logs, pipes


@dataclass(frozen=True)
class ConnectionLimits:
    header_s: float = 10.0  # connect (or the last response) to the request head's end
    body_s: float = 30.0  # the head's end to the body's last byte (2 MB at ~70 KB/s)
    keep_alive_s: float = 5.0  # idle between requests (uvicorn's default)
    reply_s: float = 30.0  # a reply the client does not read: its socket's buffer stays full
    max_connections: int = 512  # open at once; past it a new one gets 503 and is closed
    drain_s: float = 30.0  # SIGTERM to exit: what is queued is answered, the rest dropped

    def as_dict(self) -> dict:
        return {
            "timeout_header_s": self.header_s,
            "timeout_body_s": self.body_s,
            "timeout_keep_alive_s": self.keep_alive_s,
            "timeout_reply_s": self.reply_s,
            "max_connections": self.max_connections,
            "drain_timeout_s": self.drain_s,
        }


def reserve_descriptors(max_connections: int) -> str | None:
    """Raise the soft open-files limit to fit the connections (no EMFILE in accept()); why not."""
    need = max_connections + SPARE_FDS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard != resource.RLIM_INFINITY and hard < need:
        return (
            f"--max-connections {max_connections} needs {need} open files and the hard "
            f"limit is {hard} (ulimit -Hn): lower --max-connections"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    return None
