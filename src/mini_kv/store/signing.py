"""Attempt signatures: an HMAC-SHA256, with a key kept outside the store, over attempt.json's header.

The header lists the SHA-256 and size of every other file of the attempt, so one MAC over it covers the
whole attempt. Anyone who can write into `artifacts/` can rewrite an attempt consistently (records,
file list, headline): the hashes alone cannot tell it from a real one. Without the operator's key
they cannot produce a signature that holds, so `leaderboard --require-signed` ranks only attempts this
operator's mini_kv wrote.

The key comes from the environment of the command that writes or checks attempts:
`MINI_KV_SIGNING_KEY` (the key itself, at least 16 bytes) or `MINI_KV_SIGNING_KEY_FILE` (a file holding
it), never from a file inside the artifact store. `run_command` moves both variables out of the
environment for the command's lifetime (`held_from_environment`), so no child process (the worker that
runs a candidate, a compiler) inherits them.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from mini_kv.errors import UserError
from mini_kv.model import canonical_json

KEY_ENV = "MINI_KV_SIGNING_KEY"
KEY_FILE_ENV = "MINI_KV_SIGNING_KEY_FILE"
ALGORITHM = "hmac-sha256"
MIN_KEY_BYTES = 16
SIGNATURE_FIELD = "signature"
# a header field read_attempt adds after reading (never written): not part of what was signed
_NOT_SIGNED = (SIGNATURE_FIELD, "path")

_held: dict[str, str] = {}  # the variables run_command took out of os.environ, while it runs


@contextlib.contextmanager
def held_from_environment():
    """Take the key variables out of os.environ for the duration (children never inherit them); the
    command still finds them through `operator_key`. The environment is restored afterwards."""
    taken = {name: os.environ.pop(name) for name in (KEY_ENV, KEY_FILE_ENV) if name in os.environ}
    before = dict(_held)
    _held.update(taken)
    try:
        yield
    finally:
        _held.clear()
        _held.update(before)
        os.environ.update(taken)


@dataclass(frozen=True)
class SigningKey:
    secret: bytes = field(repr=False)
    source: str  # the variable or the file it came from (for messages; never the key)

    @property
    def key_id(self) -> str:
        """A public name for the key: tells which key signed an attempt without revealing it."""
        return hashlib.sha256(b"mini_kv attempt key id\0" + self.secret).hexdigest()[:16]


def _setting(name: str) -> str | None:
    return os.environ.get(name) or _held.get(name) or None


def operator_key(artifacts: Path | None) -> SigningKey | None:
    """The operator's key, or None when neither variable is set. UserError (exit 2) for a key that is
    too short, a key file that cannot be read, or one inside the artifact store (where whoever can
    rewrite attempts could read it)."""
    value, path = _setting(KEY_ENV), _setting(KEY_FILE_ENV)
    if value and path:
        raise UserError(f"both {KEY_ENV} and {KEY_FILE_ENV} are set: set one of them")
    if value:
        return _checked(value.encode("utf-8", "surrogateescape"), KEY_ENV)
    if not path:
        return None
    key_file = Path(path).expanduser()
    if artifacts is not None and key_file.resolve().is_relative_to(Path(artifacts).resolve()):
        raise UserError(
            f"{KEY_FILE_ENV}={path}: the signing key lies inside the artifact store {artifacts}, where "
            "anyone who can rewrite an attempt can read it; keep it outside (e.g. ~/.config/mini_kv/key)"
        )
    try:
        secret = key_file.read_bytes().strip()
    except OSError as exc:
        raise UserError(
            f"{KEY_FILE_ENV}={path}: cannot read the signing key ({exc.strerror or exc})"
        ) from None
    return _checked(secret, f"{KEY_FILE_ENV}={path}")


def _checked(secret: bytes, source: str) -> SigningKey:
    if len(secret) < MIN_KEY_BYTES:
        raise UserError(
            f"{source}: the signing key is {len(secret)} bytes; use at least {MIN_KEY_BYTES} random "
            "bytes (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return SigningKey(secret, source)


def _payload(header: dict) -> bytes:
    return canonical_json({k: v for k, v in header.items() if k not in _NOT_SIGNED}).encode("utf-8")


def _mac(key: SigningKey, header: dict) -> str:
    return hmac.new(key.secret, _payload(header), hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class AttemptSignature:
    """attempt.json's `signature`: the MAC (ALGORITHM) of the header under the key `key_id`."""

    algorithm: str
    key_id: str
    mac: str


def signature_for(key: SigningKey | None, header: dict) -> AttemptSignature | None:
    """attempt.json's `signature` for `header` (everything but the signature itself): None unsigned."""
    return None if key is None else AttemptSignature(ALGORITHM, key.key_id, _mac(key, header))


class Signature(StrEnum):
    """What can be said of an attempt's signature with the key at hand."""

    VALID = "valid"  # signed with the operator's key, and the MAC holds
    UNSIGNED = "unsigned"  # written without a key (or its signature removed)
    OTHER_KEY = "other key"  # signed with a key that is not the one at hand
    UNCHECKED = "unchecked"  # signed, but no key is at hand to check it
    BROKEN = "broken"  # signed with the key at hand, and the MAC does not hold: TAMPERED


def claimed_key_id(header: dict) -> str | None:
    """The key id the attempt says signed it (the index keeps it), None unsigned or malformed."""
    sig = header.get(SIGNATURE_FIELD)
    return sig.get("key_id") if isinstance(sig, dict) and isinstance(sig.get("key_id"), str) else None


def check(key: SigningKey | None, header: dict) -> Signature:
    """The state of `header`'s signature under `key` (None: no key at hand)."""
    sig = header.get(SIGNATURE_FIELD)
    if sig is None:
        return Signature.UNSIGNED
    well_formed = (
        isinstance(sig, dict)
        and sig.get("algorithm") == ALGORITHM
        and isinstance(sig.get("key_id"), str)
        and isinstance(sig.get("mac"), str)
    )
    if not well_formed:
        return Signature.BROKEN if key is not None else Signature.UNCHECKED
    if key is None:
        return Signature.UNCHECKED
    if sig["key_id"] != key.key_id:
        return Signature.OTHER_KEY
    return Signature.VALID if hmac.compare_digest(sig["mac"], _mac(key, header)) else Signature.BROKEN
