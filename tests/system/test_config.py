import pytest
from pydantic import ValidationError

from raysim.system import CommConfig, SystemConfig


def test_defaults():
    cfg = SystemConfig()
    assert (cfg.compute.shift, cfg.compute.rate, cfg.compute.unit, cfg.compute.speed) == (1.0, 1.0, "sample", "none")
    assert (cfg.comm.mode, cfg.comm.phi, cfg.comm.nu) == ("burke", 1.0, 2.0)
    assert cfg.stragglers.deadline is None and cfg.stragglers.over_select == 0
    assert cfg.clock.mode == "virtual" and cfg.clock.time_scale == 0.01


def test_yaml_section_parses():
    cfg = SystemConfig.model_validate(
        {
            "compute": {"unit": "batch", "speed": "lognormal", "speed_sigma": 0.3},
            "comm": {"mode": "explicit", "phi": 10, "nu": 1.5},
            "stragglers": {"deadline": 40, "over_select": 3},
            "clock": {"mode": "real", "time_scale": 0.001},
        }
    )
    assert cfg.comm.nu == 1.5 and cfg.stragglers.deadline == 40.0 and cfg.compute.unit == "batch"


@pytest.mark.parametrize("nu", [1.0, 0.5])
def test_explicit_unstable_queue_rejected(nu):
    with pytest.raises(ValidationError, match="unstable"):
        CommConfig(mode="explicit", nu=nu)


def test_burke_does_not_need_nu_above_one():
    assert CommConfig(mode="burke", nu=1.0).nu == 1.0


@pytest.mark.parametrize(
    "section",
    [
        {"bogus": 1},
        {"comm": {"phi": 1, "rho": 2}},
        {"compute": {"shfit": 1}},
        {"stragglers": {"dead_line": 3}},
        {"clock": {"inject": "real"}},
    ],
)
def test_unknown_keys_rejected(section):
    with pytest.raises(ValidationError):
        SystemConfig.model_validate(section)


@pytest.mark.parametrize(
    "section",
    [
        {"comm": {"phi": -1}},
        {"compute": {"rate": 0}},
        {"compute": {"shift": -0.1}},
        {"compute": {"speed_sigma": -1}},
        {"compute": {"unit": "epoch"}},
        {"stragglers": {"deadline": 0}},
        {"stragglers": {"over_select": -1}},
        {"clock": {"time_scale": 0}},
    ],
)
def test_bad_values_rejected(section):
    with pytest.raises(ValidationError):
        SystemConfig.model_validate(section)
