"""The result channel of a worker child: JSON events signed with a per-run key from the parent and
numbered, so bytes from anything without the key (e.g. a candidate scanning for open fds) are
rejected. A pipe the parent owns, or a file where ncu stands between them (key in $MINI_KV_CHANNEL_KEY).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os

from mini_kv.codec import to_json

POISONED_MARKERS = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS", "cudaError")
KEY_ENV = "MINI_KV_CHANNEL_KEY"


class Channel:
    """The child's end: `dest` is the pipe's fd or a file's path."""

    def __init__(self, dest: int | str, key: bytes):
        self.f = os.fdopen(dest, "w", buffering=1) if isinstance(dest, int) else open(dest, "a", buffering=1)
        self.key = key
        self.seq = 0
        self.last: str | None = None  # the last event's kind (a judge takes another job after `done`)

    def send(self, **event) -> None:
        self.seq += 1
        self.last = event.get("event")
        # the edge where the worker's records leave it: typed records become JSON here (the one codec)
        body = json.dumps(to_json({**event, "seq": self.seq}), default=str)
        mac = hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest()
        self.f.write(json.dumps({"mac": mac, "body": body}) + "\n")
        self.f.flush()


class Verifier:
    """The parent's end: accepts only events signed with `key` and numbered in order."""

    def __init__(self, key: bytes):
        self.key = key
        self.seq = 0

    def read(self, line: bytes) -> dict:
        try:
            outer = json.loads(line)
            body, mac = outer["body"], outer["mac"]
            good = hmac.compare_digest(mac, hmac.new(self.key, body.encode(), hashlib.sha256).hexdigest())
        except (ValueError, KeyError, TypeError, AttributeError):
            good = False
        if not good:
            return {"event": "forged", "line": line[:200].decode("utf-8", "replace")}
        event = json.loads(body)
        self.seq += 1
        if event.get("seq") != self.seq:
            return {
                "event": "forged",
                "line": f"event out of sequence (got {event.get('seq')}, expected {self.seq})",
            }
        return event


def read_file(path, key: bytes) -> list[dict]:
    """Every event of a channel file, verified (a forged line reads as a `forged` event)."""
    verifier = Verifier(key)
    with open(path, "rb") as f:
        return [verifier.read(line.rstrip(b"\n")) for line in f if line.strip()]
