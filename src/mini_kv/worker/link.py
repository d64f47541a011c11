"""The socket between the judge and the subject: one JSON message per packet, file descriptors beside it.

The parent makes the socket pair and hands one end to each child, so the subject can reach nothing of
the judge's but this socket. It is SOCK_SEQPACKET: a message arrives whole or not at all, and the fds
sent with it (SCM_RIGHTS) arrive with it. The judge asks, the subject answers, strictly in turn: an
answer whose number is not the question's, or that comes unasked, is the subject speaking out of turn.
"""

from __future__ import annotations

import json
import select
import socket

MAX_MESSAGE = 1 << 20
MAX_FDS = 253  # the kernel's SCM_MAX_FD: the most one message can carry


class LinkClosed(EOFError):
    """The other end is gone (the subject died, or the judge did)."""


class LinkError(RuntimeError):
    """A message that is no message of this protocol: malformed, truncated, too many fds."""


class Link:
    """One end of the judge–subject socket, given by its fd number."""

    def __init__(self, fd: int):
        self.sock = socket.socket(fileno=fd)

    def send(self, msg: dict, fds: list[int] = ()) -> None:
        data = json.dumps(msg, allow_nan=True).encode()
        try:
            socket.send_fds(self.sock, [data], list(fds)) if fds else self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            raise LinkClosed("the other end of the link closed") from None

    def recv(self, timeout: float | None = None) -> tuple[dict, list[int]]:
        if timeout is not None and not select.select([self.sock], [], [], timeout)[0]:
            raise TimeoutError(f"no message within {timeout:.0f} s")
        try:
            data, fds, flags, _ = socket.recv_fds(self.sock, MAX_MESSAGE, MAX_FDS)
        except ConnectionResetError:
            raise LinkClosed("the other end of the link closed") from None
        if not data:
            for fd in fds:
                socket.close(fd)
            raise LinkClosed("the other end of the link closed")
        if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
            for fd in fds:
                socket.close(fd)
            raise LinkError("a message or its file descriptors were truncated")
        try:
            msg = json.loads(data)
        except ValueError:
            msg = None
        if not isinstance(msg, dict):
            for fd in fds:
                socket.close(fd)
            raise LinkError(f"not a message: {data[:200]!r}")
        return msg, fds

    def close(self) -> None:
        self.sock.close()


def pair() -> tuple[int, int]:
    """The parent's socket pair: (the judge's fd, the subject's fd), both inheritable."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE)
    return a.detach(), b.detach()
