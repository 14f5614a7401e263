"""Configuration: one parser, precedence argument > environment > default, clear errors, all documented."""

from pathlib import Path

import pytest

from commlib.config import FIELDS, Config, parse_shape, parse_size
from commlib.errors import ConfigError

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_defaults():
    config = Config.load({})
    assert config.algorithm == "auto" and config.num_streams == 1 and config.timeline is None


def test_environment_then_argument_precedence():
    env = {"COMMLIB_ALGORITHM": "ring", "COMMLIB_FUSION_THRESHOLD": "16M", "COMMLIB_TORUS_SHAPE": "2x3"}
    config = Config.load(env)
    assert config.algorithm == "ring" and config.fusion_threshold_bytes == 16 << 20
    assert config.torus_shape == (2, 3)
    assert Config.load(env, algorithm="torus2d").algorithm == "torus2d"
    assert Config.load(env, algorithm=None).algorithm == "ring"


@pytest.mark.parametrize("env, needle", [
    ({"COMMLIB_ALGORITHM": "fastest"}, "COMMLIB_ALGORITHM"),
    ({"COMMLIB_NUM_STREAMS": "0"}, "COMMLIB_NUM_STREAMS"),
    ({"COMMLIB_TORUS_SHAPE": "2by2"}, "COMMLIB_TORUS_SHAPE"),
    ({"COMMLIB_FUSION_THRESHOLD": "lots"}, "COMMLIB_FUSION_THRESHOLD"),
    ({"COMMLIB_CYCLE_TIME": "-1"}, "COMMLIB_CYCLE_TIME"),
    ({"COMMLIB_FUSION_TRESHOLD": "1M"}, "COMMLIB_FUSION_TRESHOLD"),
    ({"COMMLIB_STALL_CHECK_TIME": "10", "COMMLIB_STALL_SHUTDOWN_TIME": "5"}, "COMMLIB_STALL_SHUTDOWN_TIME"),
])
def test_invalid_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        Config.load(env)


def test_unknown_argument():
    with pytest.raises(ConfigError, match="fusion"):
        Config.load({}, fusion=3)


def test_parsers():
    assert parse_size("4K") == 4096 and parse_size("1g") == 1 << 30 and parse_size("17") == 17
    assert parse_shape("4x2") == (4, 2)
    with pytest.raises(ValueError):
        parse_shape("0x2")


def test_every_variable_is_documented_with_its_default():
    text = DOCS.read_text()
    defaults = Config()
    for attr, field in FIELDS.items():
        assert f"`{field.env}`" in text, f"{field.env} missing from docs/configuration.md"
        line = next(l for l in text.splitlines() if f"`{field.env}`" in l)
        assert f"`{getattr(defaults, attr)}`" in line, f"{field.env}: default not stated in its row"


def test_timeout_takes_seconds_or_a_unit_and_the_stall_shutdown_when_shorter():
    from commlib.config import parse_duration

    assert Config().timeout_s == 600.0
    assert parse_duration("90") == 90.0 and parse_duration("90s") == 90.0
    assert parse_duration("10m") == 600.0 and parse_duration("1.5h") == 5400.0
    for bad in ("0", "-3", "ten", "5d", ""):
        with pytest.raises(ValueError):
            parse_duration(bad)
    assert Config.load({"COMMLIB_TIMEOUT": "2m"}).timeout_s == 120.0
    assert Config.load({}, timeout_s=7).timeout_s == 7
    with pytest.raises(ConfigError, match="COMMLIB_TIMEOUT"):
        Config.load({"COMMLIB_TIMEOUT": "soon"})
    with pytest.raises(ConfigError, match="COMMLIB_TIMEOUT"):
        Config.load({}, timeout_s=0)
    shorter = Config.load({"COMMLIB_TIMEOUT": "60", "COMMLIB_STALL_CHECK_TIME": "5",
                           "COMMLIB_STALL_SHUTDOWN_TIME": "20"})
    assert shorter.wait_limit_s == 20.0 and Config.load({"COMMLIB_TIMEOUT": "60"}).wait_limit_s == 60.0


# ---- Horovod's variables --------------------------------------------------------------------------------

def _fresh_warnings(monkeypatch):
    from commlib import config

    monkeypatch.setattr(config, "_warned", set())


def test_horovod_twins_are_read_and_commlib_wins(monkeypatch):
    _fresh_warnings(monkeypatch)
    env = {"HOROVOD_FUSION_THRESHOLD": str(32 << 20), "HOROVOD_CYCLE_TIME": "3.5", "HOROVOD_CACHE_CAPACITY": "7",
           "HOROVOD_TIMELINE": "/tmp/t.json", "HOROVOD_TIMELINE_MARK_CYCLES": "1",
           "HOROVOD_STALL_CHECK_TIME_SECONDS": "5", "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "9",
           "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_NUM_NCCL_STREAMS": "2"}
    config = Config.load(env)
    assert (config.fusion_threshold_bytes, config.cycle_time_ms, config.cache_capacity) == (32 << 20, 3.5, 7)
    assert config.timeline == "/tmp/t.json" and config.timeline_mark_cycles
    assert (config.stall_check_time_s, config.stall_shutdown_time_s) == (5, 9)
    assert config.algorithm == "hierarchical" and config.num_streams == 2
    both = Config.load({**env, "COMMLIB_FUSION_THRESHOLD": "1M", "COMMLIB_ALGORITHM": "ring"})
    assert both.fusion_threshold_bytes == 1 << 20 and both.algorithm == "ring"
    assert Config.load(env, cycle_time_ms=0.5).cycle_time_ms == 0.5


@pytest.mark.parametrize("env, expect", [
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}, {"algorithm": "auto"}),
    ({"HOROVOD_TORUS_ALLREDUCE": "1"}, {"algorithm": "torus2d"}),
    ({"HOROVOD_TIMELINE": "DYNAMIC"}, {"timeline": None}),
    ({"HOROVOD_STALL_CHECK_DISABLE": "1", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30"}, {"stall_check_time_s": 0}),
    ({"HOROVOD_STALL_CHECK_DISABLE": "0", "HOROVOD_STALL_CHECK_TIME_SECONDS": "30"}, {"stall_check_time_s": 30}),
])
def test_horovod_switches(monkeypatch, env, expect):
    _fresh_warnings(monkeypatch)
    config = Config.load(env)
    for attr, value in expect.items():
        assert getattr(config, attr) == value, attr


@pytest.mark.parametrize("env, needle", [
    ({"HOROVOD_FUSION_THRESHOLD": "much"}, "HOROVOD_FUSION_THRESHOLD.*COMMLIB_FUSION_THRESHOLD"),
    ({"HOROVOD_CACHE_CAPACITY": "0"}, "HOROVOD_CACHE_CAPACITY"),
    ({"HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_TORUS_ALLREDUCE": "1"}, "two allreduce algorithms"),
])
def test_horovod_invalid_values_name_the_variable(monkeypatch, env, needle):
    _fresh_warnings(monkeypatch)
    with pytest.raises(ConfigError, match=needle):
        Config.load(env)


def test_horovod_variables_commlib_cannot_honour_warn_once(monkeypatch):
    from commlib.config import IgnoredSettingWarning

    _fresh_warnings(monkeypatch)
    env = {"HOROVOD_AUTOTUNE": "1", "HOROVOD_GLOO_IFACE": "eth0", "HOROVOD_CONTROLLER": "gloo",
           "HOROVOD_MPI_THREADS_DISABLE": "0", "HOROVOD_CPU_OPERATIONS": "MPI", "HOROVOD_DISABLE_NVTX_RANGES": "1"}
    with pytest.warns(IgnoredSettingWarning) as caught:
        Config.load(env)
    names = sorted(str(w.message).split("=")[0] for w in caught)
    assert names == ["HOROVOD_AUTOTUNE", "HOROVOD_CONTROLLER", "HOROVOD_GLOO_IFACE"], names
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Config.load(env)  # once per process


def test_every_horovod_variable_is_documented():
    from commlib.config import HOROVOD_IGNORED, HOROVOD_INHERENT, HOROVOD_TWINS

    text = DOCS.read_text()
    for name in [t.env for t in HOROVOD_TWINS] + list(HOROVOD_INHERENT):
        assert f"`{name}`" in text, f"{name} missing from docs/configuration.md"
    for name in HOROVOD_IGNORED:
        short = name.replace("HOROVOD_AUTOTUNE_", "_")
        assert f"`{name}`" in text or f"`{short}`" in text, f"{name} missing from docs/configuration.md"
