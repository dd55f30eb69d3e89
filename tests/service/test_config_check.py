"""A setting in the service's config file that nothing reads refuses the start, naming it
and the setting probably meant: traitlets itself only warns about a misspelled setting and
says nothing about a misspelled class, and the service would run without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuslice_hub.app import GPUSliceService
from gpuslice_hub.errors import ConfigError

BASE = """
c.GPUSliceService.gpu_backend = "simulated"
c.GPUSliceService.profiles = [{"name": "gpu-1", "kind": "gpu", "count": 1}]
"""


def settle(tmp_path: Path, extra: str) -> GPUSliceService:
    config = tmp_path / "gpuslice_config.py"
    config.write_text(BASE + extra + "\n")
    app = GPUSliceService()
    app.initialize(["--config", str(config)])
    return app


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        (
            "c.GPUSliceService.quota = {'default_user': {'max_slices': 1}}",
            "GPUSliceService.quota",
            "no such setting (did you mean 'quotas'?)",
        ),
        (
            "c.JobManager.preempt_grce = 30",
            "JobManager.preempt_grce",
            "no such setting (did you mean 'preempt_grace'?)",
        ),
        (
            "c.GPUSliceServce.quotas = {}",
            "GPUSliceServce",
            "no such settings section in",
        ),
        (
            "c.Spawner.cmd = ['jupyterhub-singleuser']",
            "Spawner",
            "is read by the hub, not by the gpuslice service: set c.Spawner in "
            "jupyterhub_config.py",
        ),
        (
            # (issue 48: a renamed scope left nobody admin; the scopes are fixed names now)
            "c.GPUSliceService.admin_scope = 'custom:site:gpu-admin'",
            "GPUSliceService.admin_scope",
            "removed: changing it left nobody a gpuslice admin",
        ),
        (
            "c.GPUSliceService.metrics_scope = 'custom:site:scrape'",
            "GPUSliceService.metrics_scope",
            "grant custom:gpuslice:metrics to Prometheus' service",
        ),
        (
            "c.KubernetesClusterConfig.api_url = 'https://k8s.example.org'",
            "KubernetesClusterConfig.api_url",
            "does nothing: no Kubernetes cluster is used",
        ),
    ],
)
def test_a_setting_nothing_reads_refuses_the_start(tmp_path, extra, key, message):
    with pytest.raises(ConfigError) as e:
        settle(tmp_path, extra)
    assert e.value.key == key and message in e.value.message, str(e.value)
    if key == "GPUSliceServce":
        assert "(did you mean 'GPUSliceService'?)" in e.value.message


def test_settings_of_every_class_the_service_reads_are_accepted(tmp_path):
    app = settle(
        tmp_path,
        "\n".join(
            (
                "c.Application.log_level = 'DEBUG'",
                "c.GPUSliceService.reconcile_interval = 30",
                "c.JobManager.preempt_grace = 30",
                "c.SlurmGresConfig.shards_per_gpu = 4",  # (the hub's spawner reads it too)
                "c.KubernetesResourcesConfig.share_mode = 'hami'",
                "c.KubernetesClusterConfig.sync_interval = 0",
            )
        ),
    )
    assert app.reconcile_interval == 30


def test_the_command_says_which_setting_and_exits(tmp_path):
    config = tmp_path / "gpuslice_config.py"
    config.write_text(BASE + "c.GPUSliceService.quota = {}\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert (
        "gpuslice: invalid configuration: GPUSliceService.quota: no such setting "
        "(did you mean 'quotas'?)" in done.stderr
    ), done.stderr


def test_a_warning_lead_no_shorter_than_a_profiles_timeout_is_refused(tmp_path):
    profiles = (
        "c.GPUSliceService.profiles = ["
        "{'name': 'gpu-1', 'kind': 'gpu', 'count': 1, 'idle_timeout': 1800},"
        "{'name': 'gpu-2', 'kind': 'gpu', 'count': 2, 'idle_timeout': 7200}]"
    )
    with pytest.raises(ConfigError) as e:
        settle(tmp_path, profiles + "\nc.GPUSliceService.idle_policy = {'warning_lead': 3600}")
    assert e.value.key == "idle_policy.warning_lead"
    assert "3600 s is not shorter than profile gpu-1's idle_timeout (1800 s)" in str(e.value)
    # given its own lead, the short profile is fine
    app = settle(
        tmp_path,
        profiles + "\nc.GPUSliceService.idle_policy = {'warning_lead': 3600, "
        "'profiles': {'gpu-1': {'warning_lead': 600}}}",
    )
    assert app.idle_policy_config.resolve("ann", (), "gpu-2", 7200).warning_lead == 3600
