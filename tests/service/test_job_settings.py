"""Start-up checks of the job backends: a service that would run users' jobs with its own
rights, or hand them its credentials, refuses to start and names the setting."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import ConfigError
from gpuslice_hub.jobs.backends import LocalBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.setup import check_job_settings
from tests.harness.engines import need


def manager(root: Path, **traits) -> JobManager:
    return JobManager(None, None, LocalBackend(), root, **traits)  # type: ignore[arg-type]


def app(backend: str = "local") -> SimpleNamespace:
    return SimpleNamespace(job_backend=backend, log=logging.getLogger("test"))


@pytest.mark.parametrize(
    ("traits", "key"),
    [
        ({"job_env_keep": ["LANG", "JUPYTERHUB_API_TOKEN"]}, "JobManager.job_env_keep"),
        ({"job_environment": {"JPY_API_TOKEN": "x"}}, "JobManager.job_environment"),
        ({"job_environment": {"N": 3}}, "JobManager.job_environment"),
    ],
)
def test_credentials_and_bad_values_never_reach_a_job(tmp_path, traits, key):
    with pytest.raises(ConfigError) as e:
        check_job_settings(app(), manager(tmp_path / "jobs", **traits))
    assert e.value.key == key


def test_a_local_backend_that_cannot_switch_users_refuses_to_start(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with pytest.raises(ConfigError) as e:
        check_job_settings(app(), manager(tmp_path / "jobs"))
    assert e.value.key == "JobManager.run_jobs_as_service_user"
    assert "uid 4242" in str(e.value) and "run_jobs_as_service_user = True" in str(e.value)


def test_running_jobs_as_the_service_is_allowed_but_announced(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    with caplog.at_level(logging.WARNING, "test"):
        check_job_settings(app(), manager(tmp_path / "jobs", run_jobs_as_service_user=True))
    assert "every user's batch job runs as the service's account" in caplog.text


def test_a_jobs_root_other_users_cannot_reach_is_refused(tmp_path):
    need(os.geteuid() == 0, "root (the service runs jobs as their owners only as root)")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    with pytest.raises(ConfigError) as e:
        check_job_settings(app(), manager(private / "jobs"))
    assert e.value.key == "jobs_root" and str(private) in str(e.value)
    jobs = manager(private / "jobs").root
    assert oct(jobs.stat().st_mode & 0o777) == "0o711"


@pytest.mark.parametrize(
    ("traits", "key", "words"),
    [
        ({"kubernetes_jobs_claim": "pvc"}, "JobManager.kubernetes_image", "is required"),
        ({"kubernetes_image": "img"}, "JobManager.kubernetes_jobs_claim", "is required"),
        (
            # no service account, no kubeconfig: said at start, not at the first job
            {"kubernetes_image": "img", "kubernetes_jobs_claim": "pvc"},
            "job_backend",
            "the Kubernetes API cannot be reached",
        ),
    ],
)
def test_a_kubernetes_backend_without_what_it_needs_refuses_to_start(
    tmp_path, monkeypatch, traits, key, words
):
    from gpuslice_hub.jobs.setup import kubernetes_backend

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    service = SimpleNamespace(job_backend="kubernetes", log=logging.getLogger("test"), config={})
    with pytest.raises(ConfigError) as e:
        kubernetes_backend(service, manager(tmp_path / "jobs", **traits))  # type: ignore[arg-type]
    assert e.value.key == key and words in str(e.value)


def test_aging_set_for_a_slurm_queue_is_refused_as_doing_nothing(tmp_path):
    from traitlets.config import Config

    config = Config()
    config.JobManager.aging_seconds = 600.0
    jobs = JobManager(None, None, LocalBackend(), tmp_path / "jobs", config=config)  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as e:
        check_job_settings(app("slurm"), jobs)
    assert e.value.key == "JobManager.aging_seconds" and "Slurm queues the jobs" in str(e.value)
    jobs.run_jobs_as_service_user = True  # (the folder checks are another test's)
    check_job_settings(app("local"), jobs)  # where gpuslice queues, it is what it says


def refused(tmp_path: Path, backend: str, settings: dict) -> ConfigError:
    """The refusal of ``settings`` (JobManager's, as a config file sets them) with
    ``backend``; the job folder checks are other tests'."""
    from traitlets.config import Config

    config = Config()
    for name, value in settings.items():
        setattr(config.JobManager, name, value)
    jobs = JobManager(None, None, LocalBackend(), tmp_path / "jobs", config=config)  # type: ignore[arg-type]
    jobs.run_jobs_as_service_user = True
    with pytest.raises(ConfigError) as e:
        check_job_settings(app(backend), jobs)
    return e.value


HOMES = {"preemptible": "batch", "normal": "batch", "high": "batch"}


@pytest.mark.parametrize(
    ("backend", "settings", "key", "needle"),
    [
        ("local", {"burst_partition": "cloud"}, "JobManager.burst_partition", "job_backend"),
        ("kubernetes", {"burst_partition": "cloud"}, "JobManager.burst_partition", "'kubernetes'"),
        # a job preempted in the burst partition comes back to its own: it must be named
        (
            "slurm",
            {"burst_partition": "cloud", "slurm_partitions": {**HOMES, "high": ""}},
            "JobManager.slurm_partitions",
            "high",
        ),
        (
            "slurm",
            {"burst_partition": "batch", "slurm_partitions": HOMES},
            "JobManager.burst_partition",
            "a class's own partition",
        ),
        # settings that would do nothing without a burst partition
        ("slurm", {"burst_after_wait": 1.0}, "JobManager.burst_after_wait", "nothing"),
        (
            "slurm",
            {"burst_when_allocated_above": 0.5},
            "JobManager.burst_when_allocated_above",
            "nothing",
        ),
    ],
)
def test_bad_burst_settings_are_refused_naming_the_key(tmp_path, backend, settings, key, needle):
    e = refused(tmp_path, backend, settings)
    assert e.key == key and needle in str(e), str(e)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"burst_after_wait": 0.0}, "JobManager.burst_after_wait"),
        ({"burst_after_wait": 11.0}, "JobManager.burst_after_wait"),
        ({"burst_when_allocated_above": 1.0}, "JobManager.burst_when_allocated_above"),
        ({"burst_when_allocated_above": -0.1}, "JobManager.burst_when_allocated_above"),
    ],
)
def test_burst_thresholds_out_of_range_are_refused(tmp_path, settings, key):
    with pytest.raises(ConfigError) as e:
        manager(tmp_path, **settings)
    assert e.value.key == key


def test_burst_settings_are_read(tmp_path):
    from traitlets.config import Config

    config = Config()
    config.JobManager.burst_partition = "cloud"
    config.JobManager.slurm_partitions = HOMES
    config.JobManager.burst_after_wait = 0.25
    jobs = JobManager(None, None, LocalBackend(), tmp_path / "jobs", config=config)  # type: ignore[arg-type]
    jobs.run_jobs_as_service_user = True
    check_job_settings(app("slurm"), jobs)
    standing = jobs.window_standing(utcnow())["burst"]
    assert standing == {"partition": "cloud", "after_wait": 0.25, "allocated_above": 0.8}


@pytest.mark.parametrize(
    ("backend", "settings", "key", "needle"),
    [
        ("local", {"slurm_partitions": {"normal": "gpu"}}, "JobManager.slurm_partitions", "slurm"),
        ("local", {"kubernetes_namespace": "jobs"}, "JobManager.kubernetes_namespace", "kube"),
        ("slurm", {"kubernetes_image": "img"}, "JobManager.kubernetes_image", "'kubernetes'"),
        ("kubernetes", {"slurm_qos": {"high": "q"}}, "JobManager.slurm_qos", "'slurm'"),
        (
            "local",
            {"time_window_timezone": "Europe/Berlin"},
            "JobManager.time_window_timezone",
            "does nothing without time_windows",
        ),
    ],
)
def test_another_backends_settings_are_refused_as_doing_nothing(
    tmp_path, backend, settings, key, needle
):
    e = refused(tmp_path, backend, settings)
    assert e.key == key and needle in str(e), str(e)
    if "time_window" not in key:
        assert f"with job_backend = {backend!r} it does nothing" in str(e)


@pytest.mark.parametrize(
    ("access", "needle"),
    [
        ({"urgent": {"users": ["ann"]}}, "'urgent' is no priority class"),
        ({"high": ["ann"]}, "give {'users'"),
        ({"high": {"people": ["ann"]}}, "give {'users'"),
        ({"high": {"users": "ann"}}, "'users' must be a list of names"),
        ({"normal": {"groups": [""]}}, "'groups' must be a list of names"),
    ],
)
def test_a_priority_access_that_says_nothing_clear_stops_the_service(tmp_path, access, needle):
    with pytest.raises(ConfigError) as e:
        manager(tmp_path / "jobs", priority_access=access)
    assert e.value.key == "JobManager.priority_access" and needle in str(e.value)


def test_who_may_submit_each_priority_class(tmp_path):
    # the default: high is the admins' (it takes reserved pools, preempts others' jobs)
    jobs = manager(tmp_path / "jobs")
    assert jobs.allowed_priorities("ann", ("lab",), admin=False) == ["preemptible", "normal"]
    assert jobs.allowed_priorities("root", (), admin=True) == ["preemptible", "normal", "high"]
    site = manager(
        tmp_path / "jobs",
        priority_access={"high": {"groups": ["oncall"]}, "normal": {"users": ["ann"]}},
    )
    assert site.allowed_priorities("bob", ("oncall",), False) == ["preemptible", "high"]
    assert site.allowed_priorities("ann", (), False) == ["preemptible", "normal"]
    assert site.allowed_priorities("cy", (), True) == ["preemptible", "normal", "high"]
    # {}: every class for everyone
    assert manager(tmp_path / "jobs", priority_access={}).allowed_priorities("cy", (), False) == [
        "preemptible",
        "normal",
        "high",
    ]
