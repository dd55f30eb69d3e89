"""The Kubernetes job backend's API calls (kubernetes_asyncio over real HTTP) against a
stand-in for the API server (``fake_kube_api``): what it creates, how it reads a Job's
state, how it preempts and kills. No cluster runs here; the manifests it sends are checked
against the Kubernetes schemas by the stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.engines import need_module

need_module("kubernetes_asyncio")

from gpuslice_hub.jobs.accounts import Account  # noqa: E402
from gpuslice_hub.jobs.backends.kubernetes_client import (  # noqa: E402
    KubernetesBackend,
    api_configuration,
)
from gpuslice_spawner.launchers.kubernetes import KubernetesResources  # noqa: E402
from tests.jobs.fake_kube_api import FakeCluster, start_fake_api  # noqa: E402
from tests.jobs.test_kubernetes_manifests import grant, validate  # noqa: E402

OWNER = Account("ann", 1234, 1234, (1234, 2000), "/home/ann", "/bin/bash")


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake, stop = start_fake_api(FakeCluster(validate=validate))
    yield fake
    stop()


def backend(cluster: FakeCluster, **kw: Any) -> KubernetesBackend:
    return KubernetesBackend(
        api_configuration(cluster.url),
        cluster.namespace,
        "registry.example.org/gpuslice-runner:1",
        "gpuslice-jobs",
        KubernetesResources(share_mode="hami"),
        **kw,
    )


def start(
    b: KubernetesBackend, tmp_path: Path, job_id: int = 7, attempt: str = "a1b2c3d4e5"
) -> dict:
    job_dir = tmp_path / "jobs" / str(job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "GPUSLICE_JOB_ID": str(job_id),
        "GPUSLICE_ATTEMPT_ID": attempt,
        "CUDA_VISIBLE_DEVICES": "GPU-1",
    }
    return b.start(job_id, str(job_dir), env, [grant("share", milli=250)], "preemptible", {}, OWNER)


def runner_says(ref: dict, status: str) -> None:
    Path(ref["job_dir"], "state.json").write_text(json.dumps({"status": status}))


def test_a_job_is_created_as_its_owner_holding_the_grant(cluster: FakeCluster, tmp_path: Path):
    b = backend(cluster, grace_seconds=90)
    ref = start(b, tmp_path)
    (create,) = [r for r in cluster.requests if r["method"] == "POST"]
    assert create["path"] == "/apis/batch/v1/namespaces/gpuslice/jobs"
    job = create["body"]  # checked against the schemas by the stand-in
    assert job["metadata"]["name"] == ref["k8s_job"] == "gpuslice-job-7-a1b2c3d4"
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # the servers' translation of the grant: HAMi share with its cap, on the granted node
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "25",
        "nvidia.com/gpumem": "20480",
    }
    assert pod["nodeSelector"]["kubernetes.io/hostname"] == "gpu-node-1"
    assert pod["securityContext"]["runAsUser"] == 1234
    assert pod["securityContext"]["supplementalGroups"] == [1234, 2000]
    assert pod["terminationGracePeriodSeconds"] == 90
    assert pod["priorityClassName"] == "gpuslice-preemptible"
    # the jobs volume where the service has it: one path for the job folder
    assert container["volumeMounts"] == [{"name": "jobs", "mountPath": str(tmp_path / "jobs")}]
    assert container["command"][-1] == ref["job_dir"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert "CUDA_VISIBLE_DEVICES" not in env  # the device plugin picks the device
    assert job["spec"]["backoffLimit"] == 0  # gpuslice counts restarts itself


def test_one_list_call_tells_every_runs_state(cluster: FakeCluster, tmp_path: Path):
    b = backend(cluster)
    running = start(b, tmp_path, 1)
    done = start(b, tmp_path, 2)
    failed = start(b, tmp_path, 3)
    pending = start(b, tmp_path, 4)
    cluster.run(running["k8s_job"])
    cluster.finish(done["k8s_job"], "Complete")
    cluster.finish(failed["k8s_job"], "Failed")
    runner_says(failed, "failed")
    before = len(cluster.requests)
    statuses = b.poll_many([running, done, failed, pending])
    assert [(s.alive, s.exit_code) for s in statuses] == [
        (True, None),
        (False, 0),
        (False, 1),
        (True, None),
    ]
    (listing,) = cluster.requests[before:]
    assert listing["method"] == "GET"
    assert listing["query"]["labelSelector"] == "app.kubernetes.io/name=gpuslice-job"
    assert b.poll_many([]) == []


def test_preemption_deletes_in_the_foreground_with_the_grace_and_holds_until_the_pod_is_gone(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster, grace_seconds=75)
    ref = start(b, tmp_path)
    cluster.run(ref["k8s_job"])
    b.signal_preempt(ref)
    delete = cluster.requests[-1]
    assert delete["method"] == "DELETE"
    assert delete["path"].endswith(f"/jobs/{ref['k8s_job']}")
    assert delete["query"] == {"propagationPolicy": "Foreground", "gracePeriodSeconds": "75"}
    # the pod is still checkpointing: the run is alive and keeps its slices
    assert b.poll(ref).alive
    runner_says(ref, "preempted")
    cluster.pod_gone(ref["k8s_job"])
    status = b.poll(ref)
    assert (status.alive, status.exit_code) == (False, 75)
    # killing what is already gone is not an error
    b.kill(ref)
    assert cluster.requests[-1]["query"]["gracePeriodSeconds"] == "0"


def test_a_job_gone_without_a_word_from_its_runner_has_no_exit_code(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    ref = start(b, tmp_path)
    cluster.pod_gone(ref["k8s_job"])  # deleted by someone else, runner never wrote
    status = b.poll(ref)
    assert (status.alive, status.exit_code) == (False, None)


def test_a_job_never_runs_as_root(cluster: FakeCluster, tmp_path: Path):
    # runAsNonRoot would make the kubelet refuse the pod and the Job wait forever
    root = Account("root", 0, 0, (0,), "/root", "/bin/sh")
    b = backend(cluster)
    with pytest.raises(ValueError, match="never run as root"):
        b.start(1, str(tmp_path), {}, [grant("gpu")], "normal", {}, root)
    assert cluster.jobs == {}


def test_a_job_the_api_refuses_is_an_error_not_a_job(cluster: FakeCluster, tmp_path: Path):
    from kubernetes_asyncio.client.exceptions import ApiException

    b = backend(cluster)
    b.image = ""

    def refuse(manifest: dict) -> None:
        if not manifest["spec"]["template"]["spec"]["containers"][0].get("image"):
            raise ValueError("spec.template.spec.containers[0].image: Required value")
        validate(manifest)

    cluster.validate = refuse
    with pytest.raises(ApiException) as info:
        start(b, tmp_path)
    assert info.value.status == 422 and "image: Required value" in str(info.value.body)
    assert cluster.jobs == {}


class Kubelet:
    """Plays the cluster's nodes for the service-level test: runs each new Job's container
    command as a local process with the Job's environment and its pod's user and groups
    (``securityContext``), and reports the outcome the way the Job controller does
    (``Complete``, or ``Failed`` for a non-zero exit)."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            for name, job in list(self.cluster.jobs.items()):
                container = job["spec"]["template"]["spec"]["containers"][0]
                if name not in self.procs:
                    env = {e["name"]: e["value"] for e in container.get("env", [])}
                    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
                    command = [sys.executable, *container["command"][1:]]
                    ctx = job["spec"]["template"]["spec"]["securityContext"]
                    self.procs[name] = subprocess.Popen(
                        command,
                        env=env,
                        cwd=container["workingDir"],
                        user=ctx["runAsUser"],
                        group=ctx["runAsGroup"],
                        extra_groups=ctx["supplementalGroups"],
                    )
                    self.cluster.run(name)
                elif not job["status"].get("conditions"):
                    code = self.procs[name].poll()
                    if code is not None:
                        self.cluster.finish(name, "Complete" if code == 0 else "Failed")


@pytest.mark.hub
def test_the_service_runs_a_job_through_the_kubernetes_api_as_its_owner(
    cluster: FakeCluster, hub_factory, accounts, shared_dir
):
    from tests.jobs.test_job_accounts import start as start_hub_as_owners
    from tests.jobs.test_jobs_hub import output_result, submit, wait_state

    owner = accounts[0]
    kubelet = Kubelet(cluster)
    try:
        hub = start_hub_as_owners(
            hub_factory,
            shared_dir,
            "kubernetes",
            extra=(
                "c.GPUSliceService.job_backend = 'kubernetes'\n"
                f"c.JobManager.kubernetes_api_url = {cluster.url!r}\n"
                f"c.JobManager.kubernetes_namespace = {cluster.namespace!r}\n"
                "c.JobManager.kubernetes_image = 'registry.example.org/gpuslice-runner:1'\n"
                "c.JobManager.kubernetes_jobs_claim = 'gpuslice-jobs'\n"
            ),
        )
        alice = hub.add_user(owner.pw_name)
        cells = ["import json", "w = [1.0, 2.0]", "first_step = 0", RESULT]
        r = submit(hub, alice, cells=cells, profile="mig-1g.10gb")
        assert r.status_code == 201, r.text
        job = wait_state(hub, alice, r.json()["id"], ("completed", "failed"), timeout=120)
        assert job["state"] == "completed", job
        assert output_result(hub, alice, job["id"]) == {"w": [1.0, 2.0], "first_step": 0}
        (name,) = cluster.jobs
        pod = cluster.jobs[name]["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
        # as its owner, not the service (root here)
        assert pod["securityContext"]["runAsUser"] == owner.pw_uid != 0
        # the slice was held while the Job ran, and given back when it completed
        url = f"/api/events?user={owner.pw_name}"
        events = hub.api("GET", url, hub.service_token).json()["events"]
        assert {e["kind"] for e in events} >= {"allocated", "released"}
    finally:
        kubelet.stop.set()
        kubelet.thread.join(5)


RESULT = "print('RESULT', json.dumps({'w': w, 'first_step': first_step}))"
