"""The admin's idle policy is validated when the service starts: errors name the key."""

from __future__ import annotations

import pytest
from traitlets.config import Config

from gpuslice_hub.app import GPUSliceService
from gpuslice_hub.errors import ConfigError

PROFILES = [
    {"name": "gpu-1", "kind": "gpu", "count": 1, "idle_timeout": 1200},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
]


@pytest.fixture(autouse=True)
def _no_config_file_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default gpuslice_config.py must not exist


def load(idle_policy):
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.idle_policy = idle_policy
    app = GPUSliceService(config=config)
    app.load_settings()
    return app


def test_a_valid_policy_resolves_per_profile_and_user():
    app = load(
        {
            "action": "server",
            "warning_lead": 120,
            "profiles": {"share-250": {"idle_timeout": 900, "action": "kernel"}},
            "exempt_groups": ["ops"],
        }
    )
    cfg = app.idle_policy_config
    p = cfg.resolve("ann", [], "gpu-1", app.parsed_profiles["gpu-1"].idle_timeout)
    assert (p.action, p.idle_timeout, p.warning_lead) == ("server", 1200, 120)
    p = cfg.resolve("ann", [], "share-250", app.parsed_profiles["share-250"].idle_timeout)
    assert (p.action, p.idle_timeout) == ("kernel", 900)
    assert cfg.resolve("bob", ["ops"], "gpu-1").exempt


@pytest.mark.parametrize(
    ("policy", "key"),
    [
        ({"action": "reboot"}, "idle_policy.action"),
        ({"profiles": {"gpu-9": {"idle_timeout": 60}}}, "idle_policy.profiles.gpu-9"),
        ({"exempt_profiles": ["nope"]}, "idle_policy.exempt_profiles"),
        (
            {"profiles": {"gpu-1": {"warning_lead": "soon"}}},
            "idle_policy.profiles.gpu-1.warning_lead",
        ),
        ({"idle_timeout": 100, "warning_lead": 200}, "idle_policy.warning_lead"),
        ({"exempt_users": "ann"}, "idle_policy.exempt_users"),
        # a setting that would do nothing: every profile's own idle_timeout wins over it
        ({"idle_timeout": 600}, "idle_policy.idle_timeout"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(policy, key):
    with pytest.raises(ConfigError) as e:
        load(policy)
    assert e.value.key == key


@pytest.mark.parametrize("days", [-1.0, 7.0, 29.5])
def test_a_history_retention_shorter_than_the_admin_panel_shows_is_refused(days):
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.history_retention_days = days
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).load_settings()
    assert e.value.key == "history_retention_days" and "at least 30" in str(e.value)


@pytest.mark.parametrize("days", [0.0, 30.0, 400.0])
def test_keeping_everything_or_at_least_thirty_days_is_accepted(days):
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.history_retention_days = days
    GPUSliceService(config=config).load_settings()


def test_the_log_level_setting_takes_effect():
    """It was shadowed by a plain class attribute: --log-level and the config did nothing."""
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.log_level = "DEBUG"
    assert GPUSliceService(config=config).log_level == 10
    assert GPUSliceService().log_level == 20  # INFO unless asked


@pytest.mark.parametrize(
    ("settings", "key", "needle"),
    [
        ({"quota_suggestion_days": 0.0}, "quota_suggestion_days", "at most 90"),
        ({"quota_suggestion_days": 91.0}, "quota_suggestion_days", "at most 90"),
        # a window longer than the history kept would count less than it says
        (
            {"quota_suggestion_days": 60.0, "history_retention_days": 45.0},
            "quota_suggestion_days",
            "history_retention_days (45)",
        ),
        ({"quota_suggestion_factor": 0.0}, "quota_suggestion_factor", "0.1 to 10"),
        ({"quota_suggestion_factor": 11.0}, "quota_suggestion_factor", "0.1 to 10"),
        ({"quota_suggestion_buffer_slices": -1.0}, "quota_suggestion_buffer_slices", ">= 0"),
        ({"quota_suggestion_buffer_milli": -50}, "quota_suggestion_buffer_milli", ">= 0"),
    ],
)
def test_bad_quota_suggestion_settings_are_refused_naming_the_key(settings, key, needle):
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    for name, value in settings.items():
        setattr(config.GPUSliceService, name, value)
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).load_settings()
    assert e.value.key == key and needle in str(e.value), str(e.value)


def test_quota_suggestion_settings_are_read():
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.quota_suggestion_days = 14.0
    config.GPUSliceService.quota_suggestion_factor = 1.5
    config.GPUSliceService.quota_suggestion_buffer_milli = 0
    config.GPUSliceService.history_retention_days = 30.0
    app = GPUSliceService(config=config)
    app.load_settings()
    s = app.suggestion_settings
    assert (s.days, s.factor, s.buffer_slices, s.buffer_milli) == (14.0, 1.5, 1.0, 0)


@pytest.mark.parametrize(
    ("settings", "profiles", "key", "needle"),
    [
        ({"share_overcommit_ratio": 0.9}, PROFILES, "share_overcommit_ratio", "1 (off) to 2"),
        ({"share_overcommit_ratio": 2.5}, PROFILES, "share_overcommit_ratio", "1 (off) to 2"),
        # settings that would do nothing with overcommit off
        ({"share_overcommit_headroom": 1.5}, PROFILES, "share_overcommit_headroom", "off"),
        ({"share_overcommit_days": 7.0}, PROFILES, "share_overcommit_days", "off"),
        ({"share_overcommit_min_hours": 2.0}, PROFILES, "share_overcommit_min_hours", "off"),
        (
            {"share_overcommit_ratio": 1.2, "share_overcommit_headroom": 0.9},
            PROFILES,
            "share_overcommit_headroom",
            "1 to 3",
        ),
        (
            {"share_overcommit_ratio": 1.2, "share_overcommit_days": 91.0},
            PROFILES,
            "share_overcommit_days",
            "at most 90",
        ),
        (
            {
                "share_overcommit_ratio": 1.2,
                "share_overcommit_days": 60.0,
                "history_retention_days": 45.0,
            },
            PROFILES,
            "share_overcommit_days",
            "history_retention_days (45)",
        ),
        (
            {"share_overcommit_ratio": 1.2, "share_overcommit_min_hours": 0.5},
            PROFILES,
            "share_overcommit_min_hours",
            ">= 1 hour",
        ),
        # nothing it could apply to: shares without a memory cap are not overcommitted
        (
            {"share_overcommit_ratio": 1.2},
            [{"name": "share", "kind": "share", "gpu_milli": 250}],
            "share_overcommit_ratio",
            "no profile could be overcommitted",
        ),
        # an engine that counts the shares itself
        (
            {"share_overcommit_ratio": 1.2, "job_backend": "slurm"},
            PROFILES,
            "share_overcommit_ratio",
            "job_backend = 'slurm'",
        ),
    ],
)
def test_bad_overcommit_settings_are_refused_naming_the_key(settings, profiles, key, needle):
    config = Config()
    config.GPUSliceService.profiles = profiles
    for name, value in settings.items():
        setattr(config.GPUSliceService, name, value)
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).load_settings()
    assert e.value.key == key and needle in str(e.value), str(e.value)


def test_overcommit_settings_are_read():
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.share_overcommit_ratio = 1.3
    config.GPUSliceService.share_overcommit_days = 14.0
    config.GPUSliceService.share_overcommit_min_hours = 8.0
    app = GPUSliceService(config=config)
    app.load_settings()
    s = app.overcommit_settings
    assert (s.on, s.ratio, s.headroom, s.days, s.min_hours) == (True, 1.3, 1.2, 14.0, 8.0)


def test_the_silent_server_check_without_the_reconciler_is_refused_when_asked_for(caplog):
    config = Config()
    config.GPUSliceService.profiles = PROFILES
    config.GPUSliceService.reconcile_interval = 0.0
    config.GPUSliceService.reclaim_silent_after = 900.0
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).load_settings()
    assert e.value.key == "reclaim_silent_after" and "reconcile_interval = 0" in str(e.value)
    # left at its default, the reconciler off is said, not refused
    del config.GPUSliceService["reclaim_silent_after"]

    def warned() -> str:
        app = GPUSliceService(config=config)
        app.log.addHandler(caplog.handler)  # (the service's log does not reach the root's)
        try:
            app.load_settings()
        finally:
            app.log.removeHandler(caplog.handler)
        return caplog.text

    assert "never stopped by the service" in warned()
    config.GPUSliceService.reclaim_silent_after = 0.0  # off: nothing to say
    caplog.clear()
    assert "never stopped" not in warned()
