"""The servers' binary messages (commlib.server.protocol), in one process: every kind round-trips, and
nothing else decodes: a pickle, the wrong kind, a cut or padded message, a field out of range. And no
module of the servers' side unpickles anything or calls mpi4py's pickling methods."""

import ast
import pathlib
import pickle
import struct

import pytest

from commlib.server import protocol
from planted import planted

ROOT = pathlib.Path(__file__).resolve().parents[2]

EXAMPLES = [
    protocol.Push("layer1.weight", 3, 10_000, "bfloat16", 512, 0, 4, 2, 77),
    protocol.Push("grads", 0, 100, "float32", 100, 0, 2, 1, 16, "sparse", 64),
    protocol.Answer(1234),
    protocol.Refusal(99, "worker 1 declared float32[4], worker 0 declared float32[5] \u00e9"),
    protocol.Hello(b"0123456789abcdef", 5),
    protocol.GeoMessage("push", "geo/w#0", 2, 5000, 1024, "float64", -1, 1, 7),
    protocol.GeoReply("values", "geo/w#0", 2, 7, 3, "", 8192),
    protocol.GeoReply("waiting", "geo/w#0", 2, 7, 3, "held until worker(s) [2] push round 6"),
    protocol.Report("server", "host-b", "10.0.0.2,127.0.0.1"),
    protocol.Listening("10.0.0.2:41234", "0123456789abcdef"),
    protocol.Listening(error="cannot listen"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_kind_round_trips(message):
    data = message.encode()
    assert len(data) <= message.LAYOUT.max_size
    assert type(message).decode(data) == message



KINDS = sorted({type(m) for m in EXAMPLES}, key=lambda k: k.__name__)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_pickle_never_decodes(kind, tmp_path):
    for payload in (planted(tmp_path / "ran"), pickle.dumps(EXAMPLES[0])):
        with pytest.raises(protocol.ProtocolError):
            kind.decode(payload)
    assert not (tmp_path / "ran").exists()


def malformed_pushes():
    good = EXAMPLES[0].encode()
    fixed = protocol.Push.LAYOUT.fixed.size
    yield "empty", b""
    yield "cut in the fixed part", good[:fixed - 1]
    yield "cut in the key", good[:-3]
    yield "one byte more", good + b"\0"
    yield "another kind", protocol.Answer(77).encode()
    yield "kind byte changed", bytes([9]) + good[1:]
    yield "key not UTF-8", good[:fixed] + b"\xff" * (len(good) - fixed)
    fields = dict(key="k", part=0, total=10, wire="float32", count=10, op=0, contributors=2, worker=0, slot=16)
    yield "an op that is not one", protocol.Push(**dict(fields, op=9)).encode()
    yield "no contributors", protocol.Push(**dict(fields, contributors=0)).encode()
    yield "more elements than the tensor", protocol.Push(**dict(fields, count=11)).encode()
    yield "a control tag as slot", protocol.Push(**dict(fields, slot=3)).encode()
    huge = protocol.MAX_PUSH_BYTES // 4 + 1
    yield "more values than a push may carry", protocol.Push(**dict(fields, total=huge, count=huge)).encode()
    yield "a compressed push that decodes to too much", protocol.Push(
        **dict(fields, total=huge, count=huge, codec="onebit", nbytes=100)).encode()
    yield "a compressed payload too long", protocol.Push(
        **dict(fields, codec="sparse", nbytes=protocol.MAX_PUSH_BYTES + 1)).encode()
    raw = bytearray(good)
    wire_at = struct.calcsize("<BHIQ")  # kind, key length, part, total: then the wire dtype's code
    raw[wire_at] = 200
    yield "a dtype code out of range", bytes(raw)
    # a key whose length field says more than the limit
    length_at = 1  # the key's length comes first after the kind byte
    raw = bytearray(good)
    raw[length_at:length_at + 2] = (protocol.MAX_KEY_BYTES + 1).to_bytes(2, "little")
    yield "a key longer than allowed", bytes(raw)


@pytest.mark.parametrize("why, data", list(malformed_pushes()), ids=[w for w, _ in malformed_pushes()])
def test_a_malformed_push_header_is_refused_saying_why(why, data):
    with pytest.raises(protocol.ProtocolError) as caught:
        protocol.Push.decode(data)
    assert str(caught.value)


def test_a_sender_cannot_encode_what_the_servers_refuse():
    with pytest.raises(protocol.ProtocolError, match="at most 1024"):
        protocol.Push("k" * 2000, 0, 1, "float32", 1, 0, 1, 0, 16).encode()
    with pytest.raises(protocol.ProtocolError, match="not one of"):
        protocol.Push("k", 0, 1, "bool", 1, 0, 1, 0, 16).encode()
    assert len(protocol.cut("\u00e9" * 5000).encode()) <= protocol.MAX_TEXT_BYTES


def test_geo_messages_and_the_start_up_messages_are_checked():
    with pytest.raises(protocol.ProtocolError):
        protocol.GeoMessage.decode(protocol.GeoMessage("push", "k", 0, 10, 11, "float32", 0, 0, 1).encode())
    with pytest.raises(protocol.ProtocolError):
        protocol.GeoMessage.decode(protocol.GeoMessage("push", "k", 0, 10, 10, "float32", -2, 0, 1).encode())
    with pytest.raises(protocol.ProtocolError):
        protocol.GeoReply.decode(protocol.GeoReply("values", "k", 0, nbytes=protocol.MAX_PUSH_BYTES + 1).encode())
    with pytest.raises(protocol.ProtocolError):
        protocol.GeoReply.decode(protocol.GeoReply("error", "k", 0, text="x", nbytes=8).encode())
    with pytest.raises(protocol.ProtocolError, match="IPv4"):
        protocol.Report.decode(protocol.Report("worker", "h", "10.0.0.1,$(touch /tmp/x)").encode())
    with pytest.raises(protocol.ProtocolError, match="port"):
        protocol.Listening.decode(protocol.Listening("10.0.0.1:0", "t").encode())


def test_the_roll_call_table_is_bounded_and_checked():
    reports = [protocol.Report("worker", f"h{i}", "").encode() for i in range(3)]
    table = protocol.pack_table(reports[:2] + [b""], [2])
    limit = protocol.Report.LAYOUT.max_size
    assert protocol.unpack_table(table, 3, limit) == (reports[:2] + [b""], [2])
    for bad, size in ((table[:-1], 3), (table + b"\0", 3), (table, 4), (protocol.pack_table(reports, [7]), 3),
                      (protocol.pack_table([b"x" * (limit + 1)] * 3, []), 3)):
        with pytest.raises(protocol.ProtocolError):
            protocol.unpack_table(bad, size, limit)
    assert len(protocol.pack_table([b"x" * limit] * 3, [0, 1, 2])) <= protocol.table_limit(3, limit)


# -- nothing on the servers' side unpickles ------------------------------------------------------------------
#: mpi4py's lower-case methods pickle and unpickle Python objects; the servers' messages are bytes.
PICKLING = {"send", "isend", "ssend", "issend", "bsend", "ibsend", "recv", "irecv", "sendrecv", "bcast",
            "gather", "scatter", "allgather", "alltoall", "reduce", "allreduce", "loads",
            "Unpickler"}


def sources():
    server = sorted((ROOT / "commlib" / "server").glob("*.py"))
    return server + [ROOT / "commlib" / "geo.py"]


@pytest.mark.parametrize("path", sources(), ids=lambda p: p.name)
def test_no_server_module_pickles(path):
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
            found += [f"line {node.lineno}: imports {n}" for n in names if n and n.split(".")[0] in ("pickle", "marshal", "dill", "cloudpickle")]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in PICKLING:
            found.append(f"line {node.lineno}: {ast.unparse(node.func)}()")
    assert not found, f"{path.relative_to(ROOT)} pickles or unpickles: {found}"
