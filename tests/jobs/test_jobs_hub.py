"""Batch jobs through a real JupyterHub + the gpuslice service, local backend.

One simulated GPU and a whole-GPU profile: a batch job and an interactive server compete
for the same slice.
"""

from __future__ import annotations

import json
import os
import signal
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import nbformat
import numpy as np
import psutil
import pytest

from tests.harness.hub import wait_for
from tests.jobs.notebooks import TRAIN_CELLS, loop_checkpoint_written, notebook

pytestmark = pytest.mark.hub

ONE_GPU = [
    {
        "name": "node-a",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1}],
    }
]
PROFILES = [{"name": "gpu-1", "kind": "gpu", "count": 1, "preempt_batch": True}]
RESULT_CELL = "print('RESULT', json.dumps({'w': w.tolist(), 'first_step': first_step}))"


@pytest.fixture(scope="module")
def jobs_hub(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(
        tmp_path_factory.mktemp("jobs-hub"),
        hosts=ONE_GPU,
        profiles=PROFILES,
        spawner="gpuslice-simple",
        # high jobs: the admins' (the default) and the on-call group's
        extra_service_config=f"c.JobManager.priority_access = {ONCALL_HIGH!r}\n",
    )
    yield hub
    hub.stop()


ONCALL_HIGH = {"high": {"groups": ["oncall"]}}


def nb_json(cells: list[str]) -> dict:
    return json.loads(nbformat.writes(notebook(cells)))


def submit(hub, token, cells=TRAIN_CELLS, **body):
    body = {"path": "train.ipynb", "profile": "gpu-1", "notebook": nb_json(cells), **body}
    return hub.api("POST", "/api/jobs", token, json=body)


def job(hub, token, job_id):
    r = hub.api("GET", f"/api/jobs/{job_id}", token)
    assert r.status_code == 200, r.text
    return r.json()


def wait_state(hub, token, job_id, states, timeout=120):
    states = {states} if isinstance(states, str) else set(states)
    try:
        return wait_for(
            lambda: (j := job(hub, token, job_id))["state"] in states and j,
            timeout,
            f"job {job_id} to reach {states}",
        )
    except TimeoutError:
        print(json.dumps(job(hub, token, job_id), indent=1))
        print(hub.log()[-5000:])
        raise


def job_dir(hub, job_id) -> Path:
    return hub.workdir / "gpuslice-jobs" / str(job_id)


def expected_w(steps: int, lr: float) -> list[float]:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(256, 8))
    y = X @ np.arange(8.0) + rng.normal(scale=0.1, size=256)
    w = np.zeros(8)
    for _ in range(steps):
        w = w - lr * X.T @ (X @ w - y) / len(X)
    return w.tolist()


def output_result(hub, token, job_id) -> dict:
    r = hub.api("GET", f"/api/jobs/{job_id}/output", token)
    assert r.status_code == 200, r.text
    nb = nbformat.reads(r.text, as_version=4)
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    return json.loads(text.split("RESULT", 1)[1])


FORGE = (
    "import json, os, time\n"
    "forged = {'status': 'preempted', 'cells_done': 'x', 'cells_total': -5, 'attempt': [1],\n"
    "          'lost_work_seconds': 1e308, 'last_checkpoint_at': 4e12, 'error': 7,\n"
    "          'utilization': 1e9, 'memory_mib': -1, 'utilization_at': 'now',\n"
    "          'kernel_pid': 1}\n"
    "end = time.time() + 4\n"
    "while time.time() < end:\n"
    "    json.dump(forged, open('state.json.tmp', 'w'))\n"
    "    os.replace('state.json.tmp', 'state.json')\n"
    "    time.sleep(0.05)"
)


def test_an_overwritten_parameter_is_said_at_submission_and_in_the_log(jobs_hub):
    """The issue's example: no cell tagged parameters, the first cell sets n itself."""
    hub = jobs_hub
    alice = hub.add_user("alice")
    nb = notebook(["n = 5", "print('RESULT', n)"], tag_first_as_parameters=False)
    body = {"path": "p.ipynb", "profile": "gpu-1", "notebook": json.loads(nbformat.writes(nb))}
    r = hub.api("POST", "/api/jobs", alice, json={**body, "parameters": {"n": 3}})
    assert r.status_code == 201, r.text
    warnings = r.json()["warnings"]
    assert any("no cell is tagged 'parameters'" in w for w in warnings), warnings
    assert any("parameter n is set again in code cell 1" in w for w in warnings), warnings
    done = wait_state(hub, alice, r.json()["id"], ("completed", "failed"))
    log = hub.api("GET", f"/api/jobs/{done['id']}/log", alice).json()["log"]
    assert "warning: parameter n is set again in code cell 1" in log
    # the run itself follows papermill's rule: injected first, then overwritten by the cell
    r = hub.api("GET", f"/api/jobs/{done['id']}/output", alice)
    assert "RESULT 5" in r.text
    # a notebook that takes its parameters properly gets no warning
    clean = submit(hub, alice, parameters={"steps": 5})
    assert clean.json()["warnings"] == []
    wait_state(hub, alice, clean.json()["id"], ("completed", "failed"))


def test_a_job_forging_its_state_cannot_stop_the_scheduler_or_poison_figures(jobs_hub):
    """state.json is in the job's own folder: the service takes it as claims, checked."""
    hub = jobs_hub
    alice = hub.add_user("alice")
    admin = hub.add_user("admin", admin=True)
    forger = submit(hub, alice, cells=[FORGE, "print('RESULT', json.dumps({}))"]).json()
    running = wait_state(hub, alice, forger["id"], ("running", "completed", "failed"))
    # while it claims "preempted", the local backend keeps its slice (only an exit frees it)
    if running["state"] == "running":
        allocs = hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"]
        assert [a["user"] for a in allocs] == ["alice"]
    done = wait_state(hub, alice, forger["id"], ("completed", "failed"), timeout=120)
    assert done["state"] == "completed", done
    assert done["preemptions"] == 0 and done["lost_work_seconds"] == 0
    # the scheduler went on: the next job runs and completes
    nxt = submit(hub, alice, cells=["x = 1"]).json()
    assert wait_state(hub, alice, nxt["id"], ("completed", "failed"))["state"] == "completed"
    for path in ("/api/admin/overview", "/api/admin/usage", f"/api/jobs/{forger['id']}"):
        r = hub.api("GET", path, admin)
        assert r.status_code == 200, r.text
        assert "NaN" not in r.text and "Infinity" not in r.text, path


def test_bad_submissions_and_who_sees_what(jobs_hub):
    hub = jobs_hub
    alice, bob = hub.add_user("alice"), hub.add_user("bob")
    admin = hub.add_user("admin", admin=True)
    cases = [
        ({"profile": "nope"}, 404, "unknown profile"),
        ({"priority": "urgent"}, 400, "field 'priority'"),
        ({"parameters": {"1x": 2}}, 400, "not a Python identifier"),
        ({"parameters": {"import": 3}}, 400, "'import' is a Python keyword"),
        ({"parameters": {"x": object.__name__}, "slices": 0}, 400, "field 'slices'"),
        ({"checkpoint_interval": 0}, 400, "checkpoint_interval"),
        ({"burstable": True}, 400, "no burst partition"),
        ({"burstable": "yes"}, 400, "burstable"),
        ({"notebook": {"cells": "nope"}}, 400, "must be an nbformat 4 notebook"),
        ({"colour": "red"}, 400, "unknown field 'colour'"),
        ({"priority": {"a": 1}}, 400, "field 'priority'"),
        ({"name": ["x"]}, 400, "field 'name'"),
        ({"parameters": {"big": "x" * 70_000}}, 400, "larger than"),
        ({"user": "bob"}, 403, "only its owner"),
        ({"groups": ["physics"]}, 403, "looked up on the hub"),
        ({"workdir": "relative/folder"}, 400, "field 'workdir' must be an absolute path"),
        ({"workdir": ["/x"]}, 400, "field 'workdir' must be an absolute path"),
    ]
    for extra, status, needle in cases:
        r = submit(hub, alice, **extra)
        assert r.status_code == status and needle in r.json()["message"], (extra, r.text)
    # the dialog says what an empty field means, in the service's own figures
    defaults = hub.api("GET", "/api/profiles", alice).json()["jobs"]
    assert defaults == {
        "checkpoint_interval": 600,
        "max_runtime": 86400,
        "max_runtime_limit": 604800,
        # the largest submission (the server extension refuses a larger notebook itself)
        "max_notebook_bytes": 16 << 20,
        # the classes alice may submit: high is not hers (JobManager.priority_access)
        "allowed_priorities": ["preemptible", "normal"],
        # no time windows configured: nothing to choose in the dialog
        "windows": [],
        "class_windows": {},
        # no burst partition: the dialog offers no burst
        "burst": None,
    }
    r = submit(
        hub,
        alice,
        cells=["raise RuntimeError('broken on purpose')"],
        name="broken",
        max_runtime=120,
    )
    assert r.status_code == 201, r.text
    j = r.json()
    # no interval asked for: the default, but never longer than the job may run
    assert j["checkpoint_interval"] == 120 and j["max_runtime"] == 120
    assert j["state"] == "queued" and j["user"] == "alice" and j["priority"] == "preemptible"
    assert j["output_path"] == f"gpu-jobs/broken-{j['id']}"
    assert j["transitions"][0]["state"] == "queued"

    assert hub.api("GET", f"/api/jobs/{j['id']}", bob).status_code == 404
    assert hub.api("DELETE", f"/api/jobs/{j['id']}", bob).status_code == 404
    assert [x["id"] for x in hub.api("GET", "/api/jobs", bob).json()["jobs"]] == []
    assert hub.api("GET", "/api/jobs?user=alice", bob).status_code == 403
    assert j["id"] in [x["id"] for x in hub.api("GET", "/api/jobs", admin).json()["jobs"]]
    assert hub.api("POST", f"/api/jobs/{j['id']}/preempt", alice).status_code == 403

    # a failing cell: failed with the error, not requeued
    done = wait_state(hub, alice, j["id"], "failed")
    assert "RuntimeError: broken on purpose" in done["error"]
    assert done["restarts"] == 0
    assert [t["state"] for t in done["transitions"]] == ["queued", "starting", "failed"] or [
        t["state"] for t in done["transitions"]
    ] == ["queued", "starting", "running", "failed"]
    log = hub.api("GET", f"/api/jobs/{j['id']}/log", alice).json()["log"]
    assert "broken on purpose" in log
    assert hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"] == []


def at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def test_interactive_spawn_preempts_the_job_which_resumes_from_its_checkpoint(jobs_hub):
    hub = jobs_hub
    alice, _bob = hub.add_user("alice"), hub.add_user("bob")
    steps, lr = 400, 0.05
    r = submit(
        hub,
        alice,
        cells=[*TRAIN_CELLS[:3], RESULT_CELL],
        parameters={"steps": steps, "lr": lr, "delay": 0.01},
        checkpoint_interval=1,
    )
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    wait_state(hub, alice, job_id, "running")
    # the service's own page names the job that holds her slice
    page = hub.api("GET", "/", alice)
    assert page.status_code == 200 and f"batch job {job_id}" in page.text, page.text[:2000]
    d = job_dir(hub, job_id)
    wait_for(lambda: loop_checkpoint_written(d), 60, "the training loop's first checkpoint")

    # A spawn that would give up before the job's 60 s grace is over does not preempt it:
    # the job would lose its work for nobody. The refusal says why.
    hub.add_user("carol")
    for bad in ("soon", -1, True, 10**9):
        r = hub.allocate("carol", "gpu-1", wait_seconds=bad)
        assert r.status_code == 400 and "wait_seconds" in r.json()["message"], (bad, r.text)
    r = hub.allocate("carol", "gpu-1", wait_seconds=20)
    assert r.status_code == 409, r.text
    assert "may take up to 60 s to checkpoint and this spawn waits at most 20 s" in r.text
    assert job(hub, alice, job_id)["state"] == "running"

    # bob wants the only GPU: the service preempts alice's job, the spawn waits for it
    r = hub.spawn("bob", {"profile": "gpu-1"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("bob", timeout=120)
    j = job(hub, alice, job_id)
    assert j["state"] == "queued", j
    states = [t["state"] for t in j["transitions"]]
    assert states[-3:] == ["preempting", "preempted", "queued"]
    # alice is told a person needed the GPU, not who: another user's name is not hers to see
    assert "gpu-1 needed by another user's interactive server" in j["transitions"][-3]["reason"]
    log = hub.api("GET", f"/api/jobs/{job_id}/log", alice).json()
    events = hub.api("GET", "/api/events?user=alice", alice).json()["events"]
    for what, text in (("job", j), ("log", log), ("events", events)):
        assert "bob" not in json.dumps(text), (what, text)
    # a preemption is no restart (a run after the runner died)
    assert j["restarts"] == 0 and j["preemptions"] == 1 and j["lost_work_seconds"] < 5
    # back in the queue: no run is on, and the run so far is counted once
    assert j["attempt_started_at"] is None and j["run_seconds"] > 0, j
    first_run = j["run_seconds"]
    # the spawner was told to wait (202) while the job checkpointed
    assert "202 POST /services/gpuslice/api/allocations" in hub.log()

    # bob leaves: the job gets the GPU back and continues from its saved step
    hub.hub_api("DELETE", "/users/bob/server")
    hub.wait_gone("bob")
    done = wait_state(hub, alice, job_id, ("completed", "failed"), timeout=180)
    assert done["state"] == "completed", done
    # time on a GPU: both runs, and not the wait in the queue between them
    span = (at(done["finished_at"]) - at(done["started_at"])).total_seconds()
    restarted = [t for t in done["transitions"] if t["state"] == "starting"][-1]
    waited = (at(restarted["at"]) - at(j["transitions"][-1]["at"])).total_seconds()
    assert first_run < done["run_seconds"] <= span - waited + 1, (done, span, waited)
    result = output_result(hub, alice, job_id)
    assert 0 < result["first_step"] < steps
    np.testing.assert_array_equal(result["w"], expected_w(steps, lr))
    assert hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"] == []


LEAVES_A_CHILD = [
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
    " start_new_session=True)\n"
    "open('child.pid', 'w').write(str(child.pid))",
    "x = 1",
]


def test_what_a_finished_job_left_running_is_stopped_before_its_slice_is_given_back(jobs_hub):
    """A job whose code started a process and finished: the process would go on using the
    GPU the job's slice hands to the next holder. It is stopped, and the log says so."""
    hub = jobs_hub
    alice = hub.add_user("alice")
    r = submit(hub, alice, cells=LEAVES_A_CHILD, path="child.ipynb")
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    done = wait_state(hub, alice, job_id, ("completed", "failed"))
    assert done["state"] == "completed", done
    pid = int((job_dir(hub, job_id) / "child.pid").read_text())
    wait_for(
        lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie",
        30,
        "the job's left-behind process to be stopped",
    )
    log = hub.api("GET", f"/api/jobs/{job_id}/log", alice).json()["log"]
    assert "service: stopped 1 process(es) the run left running, which held its GPU" in log, log


def test_sigkilled_runner_is_requeued_and_finishes(jobs_hub):
    hub = jobs_hub
    alice = hub.add_user("alice")
    r = submit(
        hub,
        alice,
        cells=[*TRAIN_CELLS[:3], RESULT_CELL],
        parameters={"steps": 300, "delay": 0.01},
        checkpoint_interval=1,
    )
    job_id = r.json()["id"]
    wait_state(hub, alice, job_id, "running")
    d = job_dir(hub, job_id)
    wait_for(lambda: loop_checkpoint_written(d), 60, "a checkpoint")
    pid = json.loads((d / "state.json").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    j = wait_state(hub, alice, job_id, "queued", timeout=30)
    assert "runner exited unexpectedly" in j["transitions"][-1]["reason"]
    assert j["restarts"] == 1
    done = wait_state(hub, alice, job_id, ("completed", "failed"), timeout=180)
    assert done["state"] == "completed", done
    # the second attempt is recorded once its own runner has started: the killed runner's
    # state.json still said "running, attempt 1"
    started = [t["reason"] for t in done["transitions"] if t["state"] == "running"]
    assert started == ["runner started (attempt 1)", "runner started (attempt 2)"], started
    result = output_result(hub, alice, job_id)
    assert result["first_step"] > 0
    np.testing.assert_array_equal(result["w"], expected_w(300, 0.05))


LONG_LOOP = [
    "import time\nimport gpuslice.checkpoint\nckpt = gpuslice.checkpoint.open()\nckpt.restore()",
    "for step in ckpt.steps(3000):\n    time.sleep(0.01)\n    ckpt.save(step=step)",
]
NO_CHECKPOINT_LOOP = ["import time\nfor _ in range(3000):\n    time.sleep(0.01)"]


def test_high_priority_job_preempts_preemptible_never_normal(jobs_hub):
    hub = jobs_hub
    alice, _carol = hub.add_user("alice"), hub.add_user("carol")
    # (a user of a group that JobManager.priority_access gives high to)
    bob = hub.add_user("olga", groups=("oncall",))
    low = submit(hub, alice, cells=LONG_LOOP, checkpoint_interval=1).json()["id"]
    wait_state(hub, alice, low, "running")
    high = submit(hub, bob, cells=["x = 1"], priority="high").json()["id"]
    wait_state(hub, bob, high, "completed", timeout=120)
    j = job(hub, alice, low)
    preempting = [t for t in j["transitions"] if t["state"] == "preempting"]
    assert preempting and f"job {high} (high) needs its slice" in preempting[0]["reason"]
    assert j["state"] in ("queued", "starting", "running")
    assert j["preemptions"] == 1 and j["restarts"] == 0
    before = wait_state(hub, alice, low, "running")["run_seconds"]
    cancelled = hub.api("DELETE", f"/api/jobs/{low}", alice).json()
    assert cancelled["state"] == "cancelled"
    # the run the cancel stopped counts as time on a GPU too
    assert cancelled["run_seconds"] > before, cancelled
    log = hub.api("GET", f"/api/jobs/{low}/log", alice).json()["log"]
    assert "service: cancelled by alice; stopping it" in log, log

    normal = submit(hub, alice, cells=NO_CHECKPOINT_LOOP, priority="normal").json()["id"]
    wait_state(hub, alice, normal, "running")
    urgent = submit(hub, bob, cells=["x = 1"], priority="high").json()["id"]
    r = hub.spawn("carol", {"profile": "gpu-1"})
    if r.status_code == 202:
        events = hub.progress_events("carol")
        assert events[-1].get("failed"), events
        message = events[-1]["message"]
    else:
        message = r.json()["message"]
    assert "No gpu-1 free" in message
    j = wait_for(
        lambda: (x := job(hub, bob, urgent))["waiting_reason"] and x, 30, "a waiting reason"
    )
    assert j["state"] == "queued" and "No gpu-1 free" in j["waiting_reason"]
    assert job(hub, alice, normal)["state"] == "running"
    assert "preempting" not in [t["state"] for t in job(hub, alice, normal)["transitions"]]
    hub.api("DELETE", f"/api/jobs/{normal}", alice)
    wait_state(hub, bob, urgent, "completed", timeout=120)


def test_only_those_the_priority_access_names_may_submit_high(jobs_hub):
    """high takes the reserved pools and preempts other users' jobs: by default the admins'
    only, and the groups JobManager.priority_access names (here: oncall)."""
    hub = jobs_hub
    plain = hub.add_user("pat")
    admin = hub.add_user("admin", admin=True)
    oncall = hub.add_user("otto", groups=("oncall",))
    r = submit(hub, plain, cells=["x = 1"], priority="high")
    assert r.status_code == 403, r.text
    refusal = r.json()
    assert refusal["code"] == "forbidden_priority", refusal
    assert "JobManager.priority_access" in refusal["message"], refusal
    assert refusal["allowed_priorities"] == ["preemptible", "normal"]
    assert "oncall" not in refusal["message"]  # (who else may is not the user's to know)
    assert hub.api("GET", "/api/jobs", plain).json()["jobs"] == []  # nothing was queued
    # the submit dialog offers each user the classes they may submit
    for token, classes in (
        (plain, ["preemptible", "normal"]),
        (admin, ["preemptible", "normal", "high"]),
        (oncall, ["preemptible", "normal", "high"]),
    ):
        jobs = hub.api("GET", "/api/profiles", token).json()["jobs"]
        assert jobs["allowed_priorities"] == classes
    # another user's classes are not known to the service (their admin scope is the hub's)
    standing = hub.api("GET", "/api/profiles?user=pat", admin).json()
    assert standing["jobs"]["allowed_priorities"] is None
    for token in (admin, oncall):
        r = submit(hub, token, cells=["x = 1"], priority="high")
        assert r.status_code == 201 and r.json()["priority"] == "high", r.text
        # (not run: the module's one GPU is for the other tests)
        assert hub.api("DELETE", f"/api/jobs/{r.json()['id']}", token).status_code == 200


def test_the_admin_overview_shows_what_the_job_folders_take(jobs_hub):
    hub = jobs_hub
    admin, plain = hub.add_user("admin", admin=True), hub.add_user("pat")
    assert submit(hub, plain, slices=2).status_code == 201  # (a folder, whatever else ran)

    def measured():
        standing = hub.api("GET", "/api/admin/overview", admin).json()["jobs_root"]
        return standing["measured_at"] and standing["folders"] and standing

    # measured by the folder sweep (at the service's start, then every 10 minutes), with
    # the folders made and removed since
    standing = wait_for(measured, 30, "the jobs root to be measured")
    assert standing["bytes"] > 0 and standing["folders"] >= 1, standing
    assert standing["path"] == str(hub.workdir / "gpuslice-jobs")
    assert standing["user_cap_bytes"] == 10 << 30 and standing["retention_days"] == 7


def test_service_restart_mid_run_loses_no_job(jobs_hub):
    hub = jobs_hub
    alice = hub.add_user("alice")
    job_id = submit(
        hub,
        alice,
        cells=[*LONG_LOOP[:1], LONG_LOOP[1].replace("3000", "600")],
        checkpoint_interval=1,
    ).json()["id"]
    wait_state(hub, alice, job_id, "running")
    pid = hub.service_pid()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: hub.service_pid() != pid, 60, "the hub to restart the service")
    done = wait_state(hub, alice, job_id, ("completed", "failed"), timeout=120)
    assert done["state"] == "completed", done
    assert done["restarts"] == 0  # the runner outlived the service and was found again
    # (its slice is given back by the pass that saw it end: on a loaded machine, after the
    # state was read)
    wait_for(
        lambda: hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"] == [],
        30,
        "the job's slice to be given back",
    )


def test_max_runtime_and_all_or_nothing_slices(jobs_hub):
    hub = jobs_hub
    alice = hub.add_user("alice")
    # two slices on a one-GPU cluster: never started, and never holds half of what it needs
    wide = submit(hub, alice, cells=["x = 1"], slices=2).json()["id"]
    j = wait_for(
        lambda: (x := job(hub, alice, wide))["waiting_reason"] and x, 30, "a waiting reason"
    )
    assert j["state"] == "queued" and "No 2 gpu-1 slices free at once" in j["waiting_reason"]
    assert hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"] == []
    assert hub.api("DELETE", f"/api/jobs/{wide}", alice).json()["state"] == "cancelled"
    assert hub.api("DELETE", f"/api/jobs/{wide}", alice).status_code == 409
    # her own cancellation is no admin action: the admin panel's action log does not list it
    admin = hub.add_user("admin", admin=True)
    actions = hub.api("GET", "/api/admin/actions", admin).json()["actions"]
    assert not [a for a in actions if a.get("detail", {}).get("job_id") == wide], actions

    slow = submit(hub, alice, cells=NO_CHECKPOINT_LOOP, max_runtime=3).json()["id"]
    done = wait_state(hub, alice, slow, ("timed-out", "completed", "failed"), timeout=60)
    assert done["state"] == "timed-out", done
    assert "max runtime" in done["transitions"][-1]["reason"]
    # the runner is killed and writes nothing more: its log says why it stopped there
    log = hub.api("GET", f"/api/jobs/{slow}/log", alice).json()["log"]
    assert "service: timed out: ran past its max runtime of 3 s; stopping it" in log, log
    wait_for(
        lambda: hub.api("GET", "/api/allocations", hub.service_token).json()["allocations"] == [],
        10,
        "the slice to be released",
    )


TWO_MODELS = [
    {
        "name": f"node-{model.lower()}",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [{"model": f"NVIDIA {model}", "memory_mib": 81920, "count": 1}],
    }
    for model in ("A100", "H100")
]
# A loop that ignores the preemption signal: it is killed when its grace is over.
STUBBORN_LOOP = [
    "import time\nprint('looping', flush=True)\nfor _ in range(30000):\n    time.sleep(0.01)"
]


def test_a_pending_preemption_holds_back_only_the_slice_it_frees(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(
        tmp_path_factory.mktemp("two-models-hub"),
        hosts=TWO_MODELS,
        profiles=[
            {
                "name": "a100",
                "kind": "gpu",
                "count": 1,
                "models": ["NVIDIA A100"],
                "preempt_batch": True,
            },
            {"name": "h100", "kind": "gpu", "count": 1, "models": ["NVIDIA H100"]},
        ],
        spawner="gpuslice-simple",
        extra_service_config="c.JobManager.preempt_grace = 15\n",
    )
    try:
        alice, carol = hub.add_user("alice"), hub.add_user("carol")
        hub.add_user("bob")
        low = submit(hub, alice, cells=STUBBORN_LOOP, profile="a100").json()["id"]
        wait_state(hub, alice, low, "running")
        log = job_dir(hub, low) / "job.log"
        wait_for(lambda: "[cell 1] looping" in log.read_text(), 60, "the loop to run")
        # bob's server needs the A100: the job is asked to checkpoint, and takes its time.
        # (The hub answers a spawn after up to 10 s: asked from a thread, not to wait.)
        spawn = ThreadPoolExecutor(1).submit(hub.spawn, "bob", {"profile": "a100"})
        wait_state(hub, alice, low, "preempting", timeout=30)
        # meanwhile a job for the free H100 does not wait for that preemption
        other = submit(hub, carol, cells=["x = 1"], profile="h100").json()["id"]
        assert wait_state(hub, carol, other, "completed", timeout=60)["state"] == "completed"
        assert job(hub, alice, low)["state"] == "preempting"  # its grace is not over yet
        # and bob gets the A100 once the job is gone
        assert spawn.result(timeout=60).status_code in (201, 202)
        hub.wait_ready("bob", timeout=90)
        held = hub.api("GET", "/api/allocations?user=bob", hub.service_token).json()
        assert [a["profile"] for a in held["allocations"]] == ["a100"]
        assert job(hub, alice, low)["state"] == "queued"  # requeued behind bob
    finally:
        hub.stop()
