"""Configuration: one parser, precedence argument > environment > default, clear errors, all documented."""

from pathlib import Path

import pytest

from commlib.config import FIELDS, Config, parse_shape, parse_size
from commlib.errors import ConfigError

DOCS = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"


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
