"""The algorithm registry and the cost model, in process: one signature, names, formulas, profiles.

(Every registered algorithm runs on real ranks in test_algorithms.py; the profile's broadcast and
--calibrate run in test_bench.py.)"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from commlib.algorithms import cost, select, spec
from commlib.compression import Compression
from commlib.config import Config
from commlib.errors import ConfigError

MiB = 1 << 20


def test_every_algorithm_has_one_entry_signature():
    reference = inspect.signature(spec.get("ring").run)
    for s in spec.SPECS:
        params = list(inspect.signature(s.run).parameters.values())
        assert [p.name for p in params[:4]] == ["ctx", "buf", "op", "codec"], s.name
        kw = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}
        assert kw == {"prescale": 1.0, "postscale": 1.0}, (s.name, reference)
        if s.run_many is not None:
            assert list(inspect.signature(s.run_many).parameters)[:4] == ["ctx", "bufs", "op", "codec"], s.name


def test_the_configuration_accepts_exactly_the_registry():
    assert spec.names() == ("auto",) + tuple(s.name for s in spec.SPECS)
    for name in spec.names():
        assert Config.load({"COMMLIB_ALGORITHM": name}).algorithm == name
    with pytest.raises(ConfigError, match="hierarchical_pipelined"):  # the message lists the registry
        Config.load({"COMMLIB_ALGORITHM": "fastest"})


def _best(model, nbytes, shape, codec=None, exclude=()):
    specs = [s for s in spec.SPECS if s.name not in exclude and (codec is None or s.name != "native")]
    return select.rank_all(model, nbytes, shape, specs, codec, MiB)[0]


def test_formulas_follow_the_link_classes():
    one_node = cost.Shape((0, 0), cma=True, torus=(2, 1))
    two_by_two = cost.Shape.blocks(2, 2)
    model = cost.DEFAULTS
    for s in spec.SPECS:  # nothing to do costs nothing; more bytes never cost less
        assert s.cost(model, 0, two_by_two, None, MiB) == 0.0 or s.cost(model, 0, two_by_two, None, MiB) == cost.INF
        small, large = (s.cost(model, n, one_node, None, MiB) for n in (4096, 64 * MiB))
        assert small <= large, s.name
    assert cost.cma(model, MiB, two_by_two) == cost.INF, "cma only runs on one node"
    assert cost.native(model, MiB, two_by_two, Compression.fp16) == cost.INF
    # a slow network makes the algorithms that send less across it win, as measured at 1 Gbit/s
    slow = dataclasses.replace(model, inter=cost.Link(100e-6, 1 / 0.125e9))
    t = {s.name: s.cost(slow, 64 * MiB, two_by_two, None, MiB) for s in spec.SPECS}
    assert t["hierarchical"] < t["ring"] < t["rabenseifner"], t
    bound = cost.link_bound(64 * MiB, 2, 0.125e9)
    assert bound <= t["hierarchical_pipelined"] < t["hierarchical"], t
    # fp16 halves what crosses the network
    half = cost.hierarchical_pipelined(slow, 64 * MiB, two_by_two, Compression.fp16)
    assert half < 0.6 * t["hierarchical_pipelined"]
    # a native factor fitted below 1 on 2 nodes never predicts MPI below the link bound at scale
    fitted = dataclasses.replace(slow, native_beta_factor=0.5)
    for nodes in (2, 16, 256):
        shape = cost.Shape.blocks(nodes, 2)
        assert cost.native(fitted, 64 * MiB, shape) >= cost.link_bound(64 * MiB, nodes, 0.125e9), nodes


def test_auto_picks_by_least_predicted_time():
    one_node = cost.Shape((0, 0), cma=True, torus=(2, 1))
    model = cost.DEFAULTS
    assert _best(model, 4096, one_node).algorithm == "native"  # MPI's latency
    assert _best(model, 64 * MiB, one_node).algorithm == "cma"
    assert _best(model, 64 * MiB, one_node, exclude=("cma",)).algorithm != "native"
    assert _best(model, 4096, one_node, Compression.fp16).algorithm != "native"
    choice = _best(model, 64 * MiB, cost.Shape.blocks(2, 2))
    assert choice.segment_bytes in (MiB, 4 * MiB) and choice.predicted_s > 0


def test_profile_round_trip_and_errors(tmp_path):
    model = dataclasses.replace(cost.DEFAULTS, inter=cost.Link(1e-4, 8e-9), call_s=1e-5)
    doc = cost.profile_document(model, cost.Shape.blocks(2, 2), "commlib-bench --calibrate x", "2026-01-01", {})
    path = tmp_path / "tuning.json"
    cost.write_profile(path, doc)
    loaded = cost.model_from_profile(cost.read_profile(path), str(path))
    assert dataclasses.replace(loaded, source="x") == dataclasses.replace(model, source="x")
    assert json.loads(path.read_text())["shape"] == {"ranks": 4, "nodes": 2, "node_sizes": [2, 2]}
    with pytest.raises(ConfigError, match="does not exist"):
        cost.read_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"version": 1, "model": {"call_s": -1}}')
    with pytest.raises(ConfigError, match="call_s"):
        cost.model_from_profile(cost.read_profile(tmp_path / "bad.json"), "bad.json")
    (tmp_path / "text.json").write_text('{"version": 1, "model": {"call_s": "fast"}}')
    with pytest.raises(ConfigError, match="call_s"):
        cost.model_from_profile(cost.read_profile(tmp_path / "text.json"), "text.json")
    (tmp_path / "odd.json").write_text('{"version": 1, "model": {"speed": 3}}')
    with pytest.raises(ConfigError, match="unknown parameter"):
        cost.model_from_profile(cost.read_profile(tmp_path / "odd.json"), "odd.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(ConfigError, match="not a commlib tuning profile"):
        cost.read_profile(tmp_path / "other.json")


def test_profile_location(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cost.default_profile_path() == tmp_path / "commlib" / "tuning.json"
    assert cost.profile_path(None) is None  # nothing there yet: the defaults
    cost.write_profile(cost.default_profile_path(), {"version": 1, "model": {}})
    assert cost.profile_path(None) == tmp_path / "commlib" / "tuning.json"
    assert cost.profile_path("none") is None
    assert cost.profile_path(str(tmp_path / "x.json")) == tmp_path / "x.json"


def test_auto_fusion_limit_follows_the_per_call_cost():
    """The copy-or-call decision: a dearer call (between nodes, or a larger alpha) packs larger tensors;
    free copies pack everything up to the limit's ceiling, dear ones next to nothing."""
    one_node = cost.Shape((0, 0), cma=True, torus=(2, 1))
    two_by_two = cost.Shape.blocks(2, 2)
    model = cost.DEFAULTS

    def limit(m, shape):
        return select.packing_limit(m, shape, [s for s in spec.SPECS if s.name != "cma" or shape.cma], MiB)

    here, across = limit(model, one_node), limit(model, two_by_two)
    assert 4096 <= here < across <= 64 * MiB, (here, across)
    slower_calls = dataclasses.replace(model, inter=cost.Link(1e-3, model.inter.beta_s_per_byte))
    assert limit(slower_calls, two_by_two) > across
    assert limit(dataclasses.replace(model, copy_s_per_byte=1e-6), one_node) <= 1024
    assert limit(dataclasses.replace(model, copy_s_per_byte=0.0), one_node) == 128 * MiB
    # a group cma reduces in one pass: a buffer in place costs the pass little, so only tensors whose two
    # copies cost less than that are packed (the default model's copies: under 16 KiB)
    assert select.pass_limit(model) == 16 << 10 < here
    assert select.pass_limit(dataclasses.replace(model, copy_s_per_byte=1e-6)) == 256
    assert select.pass_limit(dataclasses.replace(model, copy_s_per_byte=0.0)) == 128 * MiB


def test_calibration_corrections_steer_auto_on_their_layout_only(tmp_path):
    """Measured-over-formula ratios: interpolated log-linearly in the size, clamped beyond the ends,
    applied on the node layout they were measured on (uncompressed), kept by the profile."""
    two_by_two = cost.Shape.blocks(2, 2)
    model = cost.DEFAULTS
    plain = _best(model, 64 * MiB, two_by_two)
    slowed = dataclasses.replace(model, corrections={plain.algorithm: {str(MiB): 10.0, str(16 * MiB): 10.0}},
                                 corrected_for=cost.layout_of(two_by_two))
    assert cost.layout_of(two_by_two) == "2,2"
    assert cost.correction(slowed, plain.algorithm, 64 * MiB, two_by_two) == 10.0  # beyond the largest
    assert cost.correction(slowed, plain.algorithm, 4096, two_by_two) == 10.0      # below the smallest
    assert cost.correction(slowed, "ring", 64 * MiB, two_by_two) == 1.0 or plain.algorithm == "ring"
    assert cost.correction(slowed, plain.algorithm, 64 * MiB, cost.Shape.blocks(4, 1)) == 1.0  # other layout
    assert _best(slowed, 64 * MiB, two_by_two).algorithm != plain.algorithm
    assert _best(slowed, 64 * MiB, cost.Shape.blocks(2, 2), Compression.fp16).algorithm == \
        _best(model, 64 * MiB, two_by_two, Compression.fp16).algorithm  # not applied with a codec
    halfway = dataclasses.replace(model, corrections={"ring": {"4096": 1.0, "65536": 3.0}}, corrected_for="2,2")
    assert cost.correction(halfway, "ring", 16384, two_by_two) == pytest.approx(2.0)
    # the profile keeps them; a bad ratio is an error naming it
    doc = cost.profile_document(slowed, two_by_two, "commlib-bench --calibrate x", "2026-01-01", {})
    path = tmp_path / "p.json"
    cost.write_profile(path, doc)
    loaded = cost.model_from_profile(cost.read_profile(path), str(path))
    assert loaded.corrections == slowed.corrections and loaded.corrected_for == "2,2"
    doc["model"]["corrections"] = {"ring": {"4096": -1.0}}
    cost.write_profile(path, doc)
    with pytest.raises(ConfigError, match="corrections.ring.4096"):
        cost.model_from_profile(cost.read_profile(path), str(path))
