"""cluster.batch's shipment: an attempt a worker sends back is checked against its own hashes and
manifest before the client stores a byte of it."""

from __future__ import annotations

import hashlib
import json

import pytest

from mini_kv.cluster.batch import Shipment, ShipmentInvalid, Worker, _check_shipment


def _packed(files: dict[str, bytes], listed: dict[str, bytes] | None = None, task="t", attempt_id="a1"):
    def sha(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    header = {"files": [{"path": p, "sha256": sha(d)} for p, d in (listed or files).items()]}
    shipped = {p: (sha(d), d) for p, d in {**files, "attempt.json": json.dumps(header).encode()}.items()}
    return Shipment({}, task, attempt_id, shipped, Worker("h", "w", "tcp://x", None))


def test_a_whole_shipment_gives_its_header():
    assert _check_shipment(_packed({"a.json": b"{}"}))["files"][0]["path"] == "a.json"


def test_bytes_changed_in_transit_are_refused():
    packed = _packed({"a.json": b"{}"})
    packed.files["a.json"] = (packed.files["a.json"][0], b"{forged}")
    with pytest.raises(ShipmentInvalid, match="damaged in transit"):
        _check_shipment(packed)


def test_a_file_the_manifest_does_not_list_is_refused():
    with pytest.raises(ShipmentInvalid, match="differ from its manifest"):
        _check_shipment(_packed({"a.json": b"{}", "extra.so": b"x"}, listed={"a.json": b"{}"}))


@pytest.mark.parametrize("name", ["../../evil", "/etc/passwd", "."])
def test_a_name_that_leaves_the_attempt_is_refused(name):
    with pytest.raises(ShipmentInvalid, match="not a plain relative name"):
        _check_shipment(_packed({name: b"x"}))
    with pytest.raises(ShipmentInvalid, match="not a plain relative name"):
        _check_shipment(_packed({"a.json": b"{}"}, task=name))
