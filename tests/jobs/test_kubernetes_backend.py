"""The Kubernetes job backend's API calls (kubernetes_asyncio over real HTTP) against a
stand-in for the API server (``fake_kube_api``): what it creates when a job is submitted, how
it reads where the cluster runs each job (or why it waits), how it preempts and kills. No
cluster runs here; the manifests it sends are checked against the Kubernetes schemas by the
stand-in."""

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
from gpuslice_hub.jobs.backends.base import SubmitRefused  # noqa: E402
from gpuslice_hub.jobs.backends.kubernetes import priority_classes  # noqa: E402
from gpuslice_hub.jobs.backends.kubernetes_client import KubernetesBackend  # noqa: E402
from gpuslice_hub.kubeapi import api_configuration  # noqa: E402
from gpuslice_hub.profiles import parse_profiles  # noqa: E402
from gpuslice_spawner.launchers.kubernetes import KubernetesResources  # noqa: E402
from tests.jobs.fake_kube_api import FakeCluster, start_fake_api  # noqa: E402
from tests.jobs.test_kubernetes_manifests import A100, validate  # noqa: E402

OWNER = Account("ann", 1234, 1234, (1234, 2000), "/home/ann", "/bin/bash")
PROFILES = parse_profiles(
    [
        {"name": "mig-1g", "kind": "mig", "mig_profile": "1g.10gb"},
        {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
        {"name": "a100", "kind": "gpu", "count": 1, "models": [A100]},
    ]
)
CLASS_VALUES = {c["metadata"]["name"]: c["value"] for c in priority_classes()}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    fake, stop = start_fake_api(FakeCluster(validate=validate, priorities=CLASS_VALUES))
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


def submit(
    b: KubernetesBackend,
    tmp_path: Path,
    job_id: int = 7,
    attempt: str = "a1b2c3d4e5",
    profile: str = "share-250",
    slices: int = 1,
    priority: str = "preemptible",
    account: Account = OWNER,
) -> dict:
    job_dir = tmp_path / "jobs" / str(job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    env = {
        "GPUSLICE_JOB_ID": str(job_id),
        "GPUSLICE_ATTEMPT_ID": attempt,
        "CUDA_VISIBLE_DEVICES": "GPU-1",
    }
    return b.submit(
        job_id, str(job_dir), env, PROFILES[profile], slices, priority, account, attempt
    )


def runner_says(ref: dict, status: str) -> None:
    """The runner's record, as the runner of this submission writes it."""
    said = {"status": status, "attempt_id": ref["attempt_id"]}
    Path(ref["job_dir"], "state.json").write_text(json.dumps(said))


def test_a_job_is_created_when_submitted_as_its_owner_asking_for_its_profile_anywhere(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster, grace_seconds=90)
    ref = submit(b, tmp_path)
    (create,) = [r for r in cluster.requests if r["method"] == "POST"]
    assert create["path"] == "/apis/batch/v1/namespaces/gpuslice/jobs"
    job = create["body"]  # checked against the schemas by the stand-in
    assert job["metadata"]["name"] == ref["k8s_job"] == "gpuslice-job-7-a1b2c3d4"
    assert job["metadata"]["labels"]["gpuslice.dev/attempt"] == "a1b2c3d4"
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    # the servers' translation of a slice of the profile: a HAMi share with its cap
    assert container["resources"]["limits"] == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "25",
        "nvidia.com/gpumem": "20480",
    }
    # on no particular node: the cluster's scheduler chooses
    assert "nodeSelector" not in pod
    assert "suspend" not in job["spec"]  # no Kueue configured
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


def test_slices_of_a_profile_sum_and_a_one_model_profile_selects_its_gpu_product(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    submit(b, tmp_path, 1, profile="mig-1g", slices=3, priority="normal")
    submit(b, tmp_path, 2, attempt="ffff0000", profile="a100", slices=2, priority="high")
    mig, whole = (r["body"]["spec"]["template"]["spec"] for r in cluster.requests)
    assert mig["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "3"}
    assert "nodeSelector" not in mig and mig["priorityClassName"] == "gpuslice-normal"
    assert whole["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    assert whole["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}


def test_with_kueue_a_job_waits_suspended_in_its_class_queue_until_admitted(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster, kueue_queues={"preemptible": "gpu-spot"})
    ref = submit(b, tmp_path)
    job = cluster.jobs[ref["k8s_job"]]
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-spot"
    status = b.poll(ref)
    assert status.alive and not status.node
    assert status.waiting == "waiting for Kueue to admit it (queue gpu-spot)"
    cluster.admit(ref["k8s_job"])
    cluster.unschedulable(ref["k8s_job"], "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    assert b.poll(ref).waiting == (
        "pending in Kubernetes (Unschedulable: 0/3 nodes are available: 3 Insufficient "
        "nvidia.com/gpu.)"
    )


def test_two_list_calls_tell_where_every_job_runs_why_it_waits_or_how_it_ended(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    refs = [submit(b, tmp_path, i, attempt=f"{i:08x}") for i in range(1, 7)]
    waiting, running, done, failed, crashed, gone = refs
    cluster.unschedulable(waiting["k8s_job"], "0/2 nodes are available")
    cluster.bind(running["k8s_job"], "gpu-node-2")
    cluster.finish(done["k8s_job"], "Complete")
    cluster.finish(failed["k8s_job"], "Failed")  # by the FailJob rule: a cell failed
    cluster.finish(crashed["k8s_job"], "Failed")
    cluster.jobs[crashed["k8s_job"]]["status"]["conditions"][0]["reason"] = "BackoffLimitExceeded"
    runner_says(gone, "completed")
    cluster.pod_gone(gone["k8s_job"])  # removed (ttlSecondsAfterFinished) before the pass
    before = len(cluster.requests)
    statuses = b.poll_many(refs)
    assert [(s.alive, s.exit_code) for s in statuses] == [
        (True, None),
        (True, None),
        (False, 0),
        (False, 1),
        (False, None),  # killed (out of memory?): unknown, so gpuslice restarts it
        (False, 0),  # the runner's own record
    ]
    w, r = statuses[0], statuses[1]
    assert w.node == "" and "0/2 nodes are available" in w.waiting
    assert w.priority == -1000  # its pod's priority, from its class
    pod = cluster.current_pod(running["k8s_job"])
    assert (r.node, r.run) == ("gpu-node-2", pod["metadata"]["name"])
    listing = cluster.requests[before:]
    assert [(q["method"], q["path"]) for q in sorted(listing, key=lambda q: q["path"])] == [
        ("GET", "/api/v1/namespaces/gpuslice/pods"),
        ("GET", "/apis/batch/v1/namespaces/gpuslice/jobs"),
    ]
    assert {q["query"]["labelSelector"] for q in listing} == {"app.kubernetes.io/name=gpuslice-job"}
    assert b.poll_many([]) == []


def test_a_pod_the_cluster_preempts_is_a_new_run_elsewhere_not_the_end_of_the_job(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    ref = submit(b, tmp_path)
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    first = b.poll(ref)
    old = cluster.disrupt(ref["k8s_job"])  # a higher-priority pod needs the GPU
    # the old pod checkpoints on gpu-node-1: the same run, ending, its GPU still in use
    status = b.poll(ref)
    assert (status.alive, status.node, status.run, status.completing) == (
        True,
        "gpu-node-1",
        first.run,
        True,
    )
    cluster.terminated(old, 75)  # then the Job controller makes the next pod
    status = b.poll(ref)
    assert status.alive and status.node == "" and "pending in Kubernetes" in status.waiting
    cluster.bind(ref["k8s_job"], "gpu-node-3")
    again = b.poll(ref)
    assert again.alive and again.node == "gpu-node-3" and again.run not in (first.run, None)


def test_preemption_deletes_in_the_foreground_with_the_grace_and_holds_until_the_pod_is_gone(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster, grace_seconds=75)
    ref = submit(b, tmp_path)
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    b.signal_preempt(ref)
    delete = cluster.requests[-1]
    assert delete["method"] == "DELETE"
    assert delete["path"].endswith(f"/jobs/{ref['k8s_job']}")
    assert delete["query"] == {"propagationPolicy": "Foreground", "gracePeriodSeconds": "75"}
    # the pod is still checkpointing on its node: the run is alive, ending, and keeps it
    status = b.poll(ref)
    assert status.alive and status.completing and status.node == "gpu-node-1"
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
    ref = submit(b, tmp_path)
    cluster.pod_gone(ref["k8s_job"])  # deleted by someone else, runner never wrote
    status = b.poll(ref)
    assert (status.alive, status.exit_code, status.state) == (False, None, "gone")


def test_a_job_never_runs_as_root(cluster: FakeCluster, tmp_path: Path):
    # runAsNonRoot would make the kubelet refuse the pod and the Job wait forever
    root = Account("root", 0, 0, (0,), "/root", "/bin/sh")
    with pytest.raises(SubmitRefused, match="never run as root") as info:
        submit(backend(cluster), tmp_path, account=root)
    assert info.value.permanent and cluster.jobs == {}


def test_a_job_the_api_refuses_is_refused_for_good_and_an_unreachable_api_for_now(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    b.image = ""

    def refuse(manifest: dict) -> None:
        if not manifest["spec"]["template"]["spec"]["containers"][0].get("image"):
            raise ValueError("spec.template.spec.containers[0].image: Required value")
        validate(manifest)

    cluster.validate = refuse
    with pytest.raises(SubmitRefused) as info:
        submit(b, tmp_path)
    assert info.value.permanent and "422" in str(info.value)
    assert "image: Required value" in str(info.value)
    assert cluster.jobs == {}

    gone = KubernetesBackend(
        api_configuration("http://127.0.0.1:9"),
        "gpuslice",
        "i",
        "c",
        KubernetesResources(share_mode="hami"),
    )
    with pytest.raises(SubmitRefused, match="cannot be reached") as info:
        submit(gone, tmp_path)
    assert not info.value.permanent  # tried again later


def test_a_job_created_although_the_create_seemed_to_fail_is_found_by_its_label(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    assert b.find(7, OWNER) == ""
    ref = submit(b, tmp_path, 7)
    submit(b, tmp_path, 8, attempt="99999999")
    assert b.find(7, OWNER) == ref["k8s_job"]
    cluster.finish(ref["k8s_job"], "Failed")
    assert b.find(7, OWNER) == ""  # an ended Job is no queued submission
    # creating the very same Job again (a retry of one that did get through) is no error
    assert submit(b, tmp_path, 7)["k8s_job"] == ref["k8s_job"]


class Kubelet:
    """Plays the cluster's scheduler and nodes for the service-level test: binds each new
    Job's pod to ``node``, runs its container command as a local process with the Job's
    environment and its pod's user and groups (``securityContext``), and reports the
    outcome the way the Job controller does (``Complete``, or ``Failed`` for a non-zero
    exit)."""

    def __init__(self, cluster: FakeCluster, node: str) -> None:
        self.cluster = cluster
        self.node = node
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.wait(0.2):
            for name, job in list(self.cluster.jobs.items()):
                container = job["spec"]["template"]["spec"]["containers"][0]
                if name not in self.procs and not job["spec"].get("suspend"):
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
                    self.cluster.bind(name, self.node)
                elif name in self.procs and not job["status"].get("conditions"):
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
    kubelet = Kubelet(cluster, "node-a")
    try:
        hub = start_hub_as_owners(
            hub_factory,
            shared_dir,
            "kubernetes",
            extra=(
                "c.GPUSliceService.job_backend = 'kubernetes'\n"
                f"c.KubernetesClusterConfig.api_url = {cluster.url!r}\n"
                f"c.JobManager.kubernetes_namespace = {cluster.namespace!r}\n"
                "c.JobManager.kubernetes_image = 'registry.example.org/gpuslice-runner:1'\n"
                "c.JobManager.kubernetes_jobs_claim = 'gpuslice-jobs'\n"
                # (the device plugin's time-slicing: share-250 is one of 4 slices of a GPU)
                "c.KubernetesResourcesConfig.time_slicing_replicas = 4\n"
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
        assert "nodeSelector" not in pod  # the cluster chose the node
        # as its owner, not the service (root here)
        assert pod["securityContext"]["runAsUser"] == owner.pw_uid != 0
        # the slice was held on the node the cluster ran it on, and given back at the end
        url = f"/api/events?user={owner.pw_name}"
        events = hub.api("GET", url, hub.service_token).json()["events"]
        assert {e["kind"] for e in events} >= {"allocated", "released"}
        history = [t["reason"] for t in job["transitions"]]
        assert "Kubernetes started it on node-a" in history, history
    finally:
        kubelet.stop.set()
        kubelet.thread.join(5)


RESULT = "print('RESULT', json.dumps({'w': w, 'first_step': first_step}))"


def test_a_list_the_api_refuses_is_an_error_never_an_empty_list(
    cluster: FakeCluster, tmp_path: Path
):
    from kubernetes_asyncio.client.exceptions import ApiException

    b = backend(cluster)
    ref = submit(b, tmp_path)
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    # a service account without "list pods" (403), a busy API server (503): the pass must
    # conclude nothing (an empty list would say the pod, or the Job, is gone)
    for path, code in (("/api/v1/namespaces/gpuslice/pods", 403), (JOBS, 503)):
        cluster.errors.append(("GET", path, code))
        with pytest.raises(ApiException) as info:
            b.poll(ref)
        assert info.value.status == code
        assert cluster.errors == []  # answered to this poll, not to one still in flight
    assert b.poll(ref).node == "gpu-node-1"


JOBS = "/apis/batch/v1/namespaces/gpuslice/jobs"


def test_a_create_that_may_have_been_stored_is_unsure_and_found_before_another(
    cluster: FakeCluster, tmp_path: Path
):
    from gpuslice_hub.jobs.backends.base import SubmitUnsure

    b = backend(cluster)
    cluster.stored_then = 504  # stored, then "the request did not complete"
    with pytest.raises(SubmitUnsure, match="504"):
        submit(b, tmp_path, 7)
    (stored,) = cluster.jobs
    assert b.find(7, OWNER) == stored
    cluster.errors.append(("POST", JOBS, 503))
    with pytest.raises(SubmitUnsure, match="503"):
        submit(b, tmp_path, 8)
    for code, permanent in ((422, True), (404, False), (403, False), (429, False)):
        cluster.errors.append(("POST", JOBS, code))
        with pytest.raises(SubmitRefused) as info:
            submit(b, tmp_path, 9)
        assert info.value.permanent is permanent, code


def test_a_stale_record_of_an_earlier_submission_says_nothing_of_this_one(
    cluster: FakeCluster, tmp_path: Path
):
    b = backend(cluster)
    ref = submit(b, tmp_path)
    # the runner of an earlier submission checkpointed; this one crashed without a word
    Path(ref["job_dir"], "state.json").write_text(
        json.dumps({"status": "preempted", "attempt_id": "0000000000"})
    )
    cluster.finish(ref["k8s_job"], "Failed")
    cluster.jobs[ref["k8s_job"]]["status"]["conditions"][0]["reason"] = "BackoffLimitExceeded"
    assert b.poll(ref).exit_code is None  # a crash, not a preemption
    Path(ref["job_dir"], "state.json").write_text(
        json.dumps({"status": "preempted", "attempt_id": ref["attempt_id"]})
    )
    assert b.poll(ref).exit_code == 75


def test_a_kill_ends_the_pods_at_once_not_after_their_grace(cluster: FakeCluster, tmp_path: Path):
    b = backend(cluster, grace_seconds=600)
    ref = submit(b, tmp_path)
    cluster.bind(ref["k8s_job"], "gpu-node-1")
    b.kill(ref)
    job_delete, pods_delete = cluster.requests[-2:]
    assert job_delete["query"]["gracePeriodSeconds"] == "0"
    assert pods_delete["method"] == "DELETE"
    assert pods_delete["path"] == "/api/v1/namespaces/gpuslice/pods"
    assert pods_delete["query"] == {
        "labelSelector": f"job-name={ref['k8s_job']}",
        "gracePeriodSeconds": "0",
    }
    assert cluster.pods_of(ref["k8s_job"]) == []


def test_priority_classes_the_cluster_lacks_are_named(cluster: FakeCluster):
    b = backend(cluster)
    assert b.missing_priority_classes() == []
    del cluster.priorities["gpuslice-normal"]
    assert b.missing_priority_classes() == ["gpuslice-normal"]
