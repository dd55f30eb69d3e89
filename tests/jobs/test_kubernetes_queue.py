"""The cluster's queue is the queue on Kubernetes too: the service's pass with the Kubernetes
backend, on a ledger and job table in SQLite, against the stand-in API server
(``fake_kube_api``: real HTTP, the API's object shapes, manifests checked against the
schemas). No cluster runs here; the test plays its scheduler, Job controller and Kueue.

What is checked, as for Slurm (test_slurm_queue.py): a job becomes a Kubernetes Job when it
is seen, with no node; it waits with the scheduler's reason; the ledger records it on the
node where its pod runs and releases it when the cluster preempts the pod or the Job ends;
an interactive spawn takes a preemptible job's slice at once and leaves the preemption to
the cluster (the service steps in only when the cluster does not).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.harness.engines import need_module

need_module("kubernetes_asyncio")

from gpuslice_hub.db.jobs_models import JobRow  # noqa: E402
from gpuslice_hub.db.models import utcnow  # noqa: E402
from gpuslice_hub.errors import Pending  # noqa: E402
from gpuslice_hub.jobs.backends.kubernetes_client import KubernetesBackend  # noqa: E402
from gpuslice_hub.jobs.manager import JobManager  # noqa: E402
from gpuslice_hub.jobs.scheduler import Scheduler  # noqa: E402
from gpuslice_hub.kubeapi import api_configuration  # noqa: E402
from gpuslice_hub.ledger import Caller, Ledger  # noqa: E402
from gpuslice_spawner.launchers.kubernetes import KubernetesResources  # noqa: E402
from tests.jobs.fake_kube_api import FakeCluster, settle, start_fake_api  # noqa: E402
from tests.jobs.full_cluster import insert_queued  # noqa: E402
from tests.jobs.test_kubernetes_backend import CLASS_VALUES, OWNER  # noqa: E402
from tests.jobs.test_kubernetes_manifests import validate  # noqa: E402
from tests.jobs.test_slurm_queue import HOSTS, PROFILES  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake, stop = start_fake_api(FakeCluster(validate=validate, priorities=CLASS_VALUES))
    yield fake
    stop()


@pytest.fixture(params=[False, True], ids=["lists", "watch"])
def watch(request: pytest.FixtureRequest) -> bool:
    """Both ways the backend reads the cluster: two lists a pass (what it falls back on),
    and a watch kept current between passes (the service's way)."""
    return bool(request.param)


def setup(
    tmp_path: Path, cluster: FakeCluster, watch: bool = False
) -> tuple[Ledger, JobManager, Scheduler]:
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=HOSTS)
    backend = KubernetesBackend(
        api_configuration(cluster.url),
        cluster.namespace,
        "runner:1",
        "gpuslice-jobs",
        # the device plugin's 4 time-slices a GPU: a share-250 is one
        resources=KubernetesResources(replicas=4),
        watch=watch,
    )
    cluster.closers.append(backend.close)
    jobs = JobManager(ledger, ledger.db, backend, tmp_path / "jobs")
    jobs.log.setLevel(logging.WARNING)
    jobs.account = lambda user: OWNER  # type: ignore[method-assign]
    # (rows inserted directly, for a made-up account the service made no folder for: the
    # check of whom a job runs as is test_run_as_record.py's)
    jobs.verify_owner = lambda job, account: None  # type: ignore[method-assign]
    ledger.preempt_hook = jobs.preempt_for_interactive
    return ledger, jobs, Scheduler(jobs)


def add_jobs(jobs: JobManager, *specs: tuple[str, str]) -> list[int]:
    ids = insert_queued(jobs.db, jobs.root, [("alice", *spec) for spec in specs], "kubernetes")
    for job_id in ids:
        folder = Path(row(jobs, job_id).job_dir)
        folder.mkdir(parents=True, exist_ok=True)
    return ids


def row(jobs: JobManager, job_id: int) -> JobRow:
    found = jobs.row(job_id)
    assert found is not None
    return found


def name(jobs: JobManager, job_id: int) -> str:
    return str(row(jobs, job_id).backend_ref["k8s_job"])


def batch_slices(ledger: Ledger) -> list[tuple[str, str]]:
    return sorted(
        (a["server_name"], a["host"]) for a in ledger.allocations() if a["purpose"] == "batch"
    )


def tick(scheduler: Scheduler, cluster: FakeCluster, at: datetime | None = None) -> None:
    """A pass, once a watching backend has seen what the test did to the cluster."""
    settle(scheduler.jobs.backend, cluster)
    scheduler.tick(at)


def creates(cluster: FakeCluster) -> list[dict[str, Any]]:
    return [r for r in cluster.requests if r["method"] == "POST"]


def test_a_job_runs_where_the_cluster_places_it_and_the_ledger_holds_it_there(
    tmp_path, cluster, watch
):
    ledger, jobs, scheduler = setup(tmp_path, cluster, watch)
    a, b = add_jobs(jobs, ("gpu-1", "normal"), ("share-250", "preemptible"))
    tick(scheduler, cluster)
    assert len(creates(cluster)) == 2  # both handed to the cluster at once
    assert row(jobs, a).waiting_reason == f"submitted to Kubernetes as job {name(jobs, a)}"
    assert batch_slices(ledger) == []  # nothing is held while no pod runs

    cluster.unschedulable(name(jobs, a), "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.")
    tick(scheduler, cluster)
    assert row(jobs, a).waiting_reason == (
        "pending in Kubernetes (Unschedulable: 0/2 nodes are available: 2 Insufficient "
        "nvidia.com/gpu.)"
    )
    # the pods' priorities order the queue shown in the panel: normal before preemptible
    cluster.unschedulable(name(jobs, b), "0/2 nodes are available")
    tick(scheduler, cluster)
    page, _, _ = jobs.list_jobs(None, None, 10, order="run")
    assert [(j["id"], j["queue_position"]) for j in page] == [(a, 1), (b, 2)]

    cluster.bind(name(jobs, a), "n2")
    tick(scheduler, cluster)
    job = row(jobs, a)
    assert job.state == "starting" and job.transitions[-1].reason == "Kubernetes started it on n2"
    assert batch_slices(ledger) == [(f"job-{a}", "n2")]

    cluster.finish(name(jobs, a), "Complete")
    before = len(cluster.requests)
    tick(scheduler, cluster)
    assert row(jobs, a).state == "completed" and batch_slices(ledger) == [], row(jobs, a).error
    assert len(creates(cluster)) == 2  # never submitted again
    lists = [
        r
        for r in cluster.requests[before:]
        if r["method"] == "GET" and r["query"].get("watch") not in ("true", "True")
    ]
    # the pass read the cluster through the watch (nothing listed), or listed it
    assert len(lists) == (0 if watch else 2)


def test_a_pod_the_cluster_preempts_gives_the_slice_back_and_the_job_runs_again_elsewhere(
    tmp_path, cluster, watch
):
    ledger, jobs, scheduler = setup(tmp_path, cluster, watch)
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    tick(scheduler, cluster)
    cluster.bind(name(jobs, a), "n1")
    tick(scheduler, cluster)
    assert batch_slices(ledger) == [(f"job-{a}", "n1")]

    old = cluster.disrupt(name(jobs, a))  # a higher-priority pod needs n1's GPU
    tick(scheduler, cluster)
    # it checkpoints on n1 meanwhile: its slice is still in use there
    assert row(jobs, a).state == "starting" and batch_slices(ledger) == [(f"job-{a}", "n1")]
    cluster.terminated(old, 75)  # the Job controller makes the next pod, still unplaced
    tick(scheduler, cluster)
    job = row(jobs, a)
    assert job.state == "queued" and job.preemptions == 1 and batch_slices(ledger) == []
    assert any("Kubernetes requeued it" in t.reason for t in job.transitions)

    cluster.bind(name(jobs, a), "n2")
    tick(scheduler, cluster)
    job = row(jobs, a)
    assert job.state == "starting" and batch_slices(ledger) == [(f"job-{a}", "n2")]
    assert len(creates(cluster)) == 1  # the same Job made a new pod: no second submission


def test_an_interactive_spawn_takes_the_slice_and_the_cluster_preempts_the_job(
    tmp_path, cluster, watch
):
    ledger, jobs, scheduler = setup(tmp_path, cluster, watch)
    ledger.allocate(Caller("carol", (), "carol"), "gpu-1", "")  # n1 or n2 taken
    (a,) = add_jobs(jobs, ("gpu-1", "preemptible"))
    tick(scheduler, cluster)
    taken = {x["host"] for x in ledger.allocations() if x["purpose"] == "interactive"}
    (free,) = {h["name"] for h in HOSTS} - taken
    cluster.bind(name(jobs, a), free)
    tick(scheduler, cluster)
    assert ledger.profile_capacity()["gpu-1"][0] == 0

    bob = Caller("bob", (), "bob")
    with pytest.raises(Pending, match="Kubernetes preempts it for your server"):
        ledger.allocate(bob, "gpu-1", "", wait_seconds=5)
    job = row(jobs, a)
    assert job.state == "preempting" and job.allocation_ids == [] and job.preemptions == 1
    deletes = [r for r in cluster.requests if r["method"] == "DELETE"]
    assert deletes == []  # the cluster preempts it for the server's pod, not the service
    grant, _ = ledger.allocate(bob, "gpu-1", "", wait_seconds=5)
    assert grant["host"] == free

    # the cluster did not preempt it in time (say the server pod's priority is not above
    # gpuslice-preemptible's): the service deletes the Job with the grace period
    tick(scheduler, cluster, utcnow() + timedelta(seconds=jobs.preempt_grace + 1))
    (delete,) = [r for r in cluster.requests if r["method"] == "DELETE"]
    assert delete["path"].endswith(name(jobs, a))
    assert delete["query"]["gracePeriodSeconds"] == str(round(jobs.backend.grace_seconds))
    attempt = row(jobs, a).backend_ref["attempt_id"]
    said = f'{{"status": "preempted", "attempt_id": "{attempt}"}}'
    Path(row(jobs, a).job_dir, "state.json").write_text(said)
    # its pod ended, the Job is not gone yet (the garbage collector's finalizers): still
    # the same run, accounted for once, when the Job is gone
    cluster.pods_ended(name(jobs, a))
    tick(scheduler, cluster)
    assert row(jobs, a).state == "preempting"
    cluster.pod_gone(name(jobs, a))
    tick(scheduler, cluster)
    job = row(jobs, a)
    assert job.state == "queued" and job.preemptions == 1 and job.restarts == 0
    tick(scheduler, cluster)  # its Job is gone: it is handed to the cluster again
    assert len(creates(cluster)) == 2
    assert row(jobs, a).preemptions == 1 and row(jobs, a).restarts == 0


def test_cancelling_a_waiting_job_deletes_its_kubernetes_job(tmp_path, cluster):
    _, jobs, scheduler = setup(tmp_path, cluster)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    scheduler.tick()
    jobs.cancel(a, "alice")
    delete_job, delete_pods = [r for r in cluster.requests if r["method"] == "DELETE"]
    assert delete_job["path"].endswith(name(jobs, a))
    assert delete_pods["query"]["labelSelector"] == f"job-name={name(jobs, a)}"
    assert row(jobs, a).state == "cancelled"


def test_a_job_the_api_refuses_fails_with_its_message_and_an_unreachable_api_is_retried(
    tmp_path, cluster
):
    _, jobs, scheduler = setup(tmp_path, cluster)
    a, b = add_jobs(jobs, ("gpu-1", "normal"), ("gpu-1", "normal"))

    def refuse(manifest: dict) -> None:
        raise ValueError('spec.template.spec.priorityClassName: Invalid value: "gpuslice-normal"')

    cluster.validate = refuse
    jobs.backend.configuration.host = "http://127.0.0.1:9"  # type: ignore[attr-defined]
    scheduler.tick()
    for job_id in (a, b):
        job = row(jobs, job_id)
        assert job.state == "queued"
        assert "Kubernetes refused the submission: the Kubernetes API cannot be reached" in str(
            job.waiting_reason
        )
        assert job.not_before is not None  # backoff
    jobs.backend.configuration.host = cluster.url  # type: ignore[attr-defined]
    scheduler.tick(utcnow() + timedelta(hours=1))
    job = row(jobs, a)
    assert job.state == "failed" and "Kubernetes refused the job: 422" in str(job.error)


def test_a_job_requeued_by_the_version_that_placed_jobs_is_submitted_afresh(tmp_path, cluster):
    # that version kept the ended Job's name in a requeued job's ref, and accounted for its
    # run itself: the pass must not account for it again
    _, jobs, scheduler = setup(tmp_path, cluster)
    (a,) = add_jobs(jobs, ("gpu-1", "normal"))
    old = {"k8s_job": f"gpuslice-job-{a}-0", "namespace": cluster.namespace}
    with jobs.db.writing() as s:
        s.get(JobRow, a).backend_ref = {**old, "job_dir": row(jobs, a).job_dir}
    cluster.jobs[old["k8s_job"]] = {
        "metadata": {
            "name": old["k8s_job"],
            "namespace": cluster.namespace,
            "labels": {"app.kubernetes.io/name": "gpuslice-job"},
        },
        "spec": {"template": {"spec": {}}},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    scheduler.tick()
    job = row(jobs, a)
    assert job.state == "queued" and job.restarts == 0 and job.run_seconds == 0
    assert job.backend_ref["k8s_job"] != old["k8s_job"] and len(creates(cluster)) == 1
