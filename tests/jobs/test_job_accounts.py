"""Who a batch job runs as, and what it can see: two real system accounts (created by the
test; CI runs as root), a real JupyterHub and the gpuslice service, local and Slurm backends.

Each job records, from inside its kernel, its uid and groups, its runner's whole
environment (from /proc), and what it could read of the other user's job folder, the
ledger and the jobs root. The assertions are about those records.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.harness.hub import Hub
from tests.harness.slurm import PROFILES, slurm_hosts
from tests.jobs.test_jobs_hub import nb_json, wait_state

pytestmark = pytest.mark.hub

# What the runner's environment may hold (docs/admin-guide.md, "Security model").
IDENTITY = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "JUPYTER_RUNTIME_DIR", "PYTHONUNBUFFERED"}
JOB_VARS = {
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "GPUSLICE_JOB_ID",
    "GPUSLICE_ALLOCATION_ID",
    "GPUSLICE_PROFILE",
    "GPUSLICE_USAGE_INTERVAL",
    "GPUSLICE_SIMULATED",
    "GPUSLICE_ATTEMPT_ID",
}
KEPT = {"LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ"}
# Set on the node by slurmstepd (job, gres, TMPDIR) and the batch shell, not by gpuslice.
SLURM_ADDED_PREFIXES = (
    "SLURM_",
    "SLURMD_",
    "ENVIRONMENT",
    "OMPI_MCA",
    "CUDA_",
    "GPU_DEVICE",
    "ROCR_VISIBLE_DEVICES",
    "ZE_AFFINITY_MASK",
    "TMPDIR",
    "HOSTNAME",
    "MAIL",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
)

PROBE = [
    "other_dir = ''\nledger = ''\njobs_root = ''",
    """\
import json, os
def attempt(fn):
    try:
        fn()
        return "allowed"
    except OSError as e:
        return type(e).__name__
facts = {
    "uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "umask": (lambda m: (os.umask(m), m)[1])(os.umask(0)),
    "runner_env": open(f"/proc/{os.getppid()}/environ", "rb").read().decode(),
    "read_other_job": attempt(lambda: open(os.path.join(other_dir, "input.ipynb")).read()),
    "list_other_job": attempt(lambda: os.listdir(other_dir)) if other_dir else "none",
    "read_ledger": attempt(lambda: open(ledger, "rb").read(16)),
    "list_jobs_root": attempt(lambda: os.listdir(jobs_root)),
    "cwd": os.getcwd(),
}
json.dump(facts, open("facts.json", "w"))""",
]


def start(hub_factory, shared: Path, tag: str, extra: str = "", **hub: Any) -> Hub:
    ledger = shared / f"{tag}.sqlite"
    return hub_factory(
        **hub,
        db_url=f"sqlite:///{ledger}",
        jobs_as_service_user=False,
        extra_service_config=f"c.GPUSliceService.jobs_root = {str(shared / tag)!r}\n" + extra,
    )


def run_probe(hub: Hub, token: str, other_dir: str, shared: Path, tag: str) -> dict:
    params = {"other_dir": other_dir, "ledger": str(shared / f"{tag}.sqlite")}
    params["jobs_root"] = str(shared / tag)
    body = {"path": "probe.ipynb", "profile": "share-250", "notebook": nb_json(PROBE)}
    r = hub.api("POST", "/api/jobs", token, json={**body, "parameters": params})
    assert r.status_code == 201, r.text
    job = wait_state(hub, token, r.json()["id"], ("completed", "failed"), timeout=120)
    assert job["state"] == "completed", job
    facts_path = shared / tag / str(job["id"]) / "facts.json"
    return {"job": job, "dir": facts_path.parent, **json.loads(facts_path.read_text())}


def runner_env(facts: dict) -> dict[str, str]:
    pairs = [item.split("=", 1) for item in facts["runner_env"].split("\0") if "=" in item]
    return dict(pairs)


def check_isolated(hub: Hub, facts: dict, account: pwd.struct_passwd, extra_ok=()) -> None:
    assert (facts["uid"], facts["euid"], facts["gid"]) == (account.pw_uid,) * 2 + (account.pw_gid,)
    assert set(facts["groups"]) == set(os.getgrouplist(account.pw_name, account.pw_gid))
    assert facts["umask"] == 0o077
    env = runner_env(facts)
    # (and what the site sets for every job: the harness's JobManager.job_environment)
    configured = set(hub.config.get("job_environment", {}))
    unexpected = {
        k
        for k in set(env) - IDENTITY - JOB_VARS - KEPT - configured
        if not k.startswith(tuple(extra_ok))
    }
    assert not unexpected, f"not on the allow-list: {sorted(unexpected)}"
    assert IDENTITY - {"PYTHONUNBUFFERED"} <= set(env)
    assert env["USER"] == account.pw_name and env["HOME"] == account.pw_dir
    for secret in (hub.service_token, hub.admin_token, hub.config["metrics_token"]):
        assert secret not in facts["runner_env"]
    # the job's folder is the owner's alone; the jobs root can be crossed but not listed
    st = facts["dir"].stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (account.pw_uid, 0o700)
    assert stat.S_IMODE(facts["dir"].parent.stat().st_mode) == 0o711
    assert facts["list_jobs_root"] == "PermissionError"
    assert facts["read_ledger"] == "PermissionError"


def test_local_jobs_run_as_their_owners_and_see_nothing_else(accounts, shared_dir, hub_factory):
    ann, bob = accounts
    hub = start(hub_factory, shared_dir, "local")
    ann_token, bob_token = hub.add_user(ann.pw_name), hub.add_user(bob.pw_name)
    # the service's own files are not readable by users
    ledger = shared_dir / "local.sqlite"
    assert stat.S_IMODE(ledger.stat().st_mode) & 0o077 == 0

    first = run_probe(hub, ann_token, "", shared_dir, "local")
    check_isolated(hub, first, ann)
    second = run_probe(hub, bob_token, str(first["dir"]), shared_dir, "local")
    check_isolated(hub, second, bob)
    assert second["read_other_job"] == "PermissionError"
    assert second["list_other_job"] == "PermissionError"
    # the service still reads what the jobs wrote (as root), through the API only for owners
    r = hub.api("GET", f"/api/jobs/{first['job']['id']}/output", bob_token)
    assert r.status_code == 404
    assert hub.api("GET", f"/api/jobs/{first['job']['id']}/output", ann_token).status_code == 200


def test_a_user_without_a_system_account_cannot_submit(accounts, shared_dir, hub_factory):
    hub = start(hub_factory, shared_dir, "noacct")
    ghost = hub.add_user(f"nosuch{secrets.token_hex(3)}")
    body = {"path": "p.ipynb", "profile": "share-250", "notebook": nb_json(PROBE)}
    r = hub.api("POST", "/api/jobs", ghost, json=body)
    assert r.status_code == 403 and "no system account" in r.json()["message"], r.text
    assert hub.api("GET", "/api/jobs", ghost).json()["jobs"] == []
    assert list((shared_dir / "noacct").iterdir()) == []


def test_planted_links_in_a_job_folder_are_never_followed(accounts, shared_dir, hub_factory):
    """The owner's code replaces its outputs and log with links to the service's secrets;
    the service (root) reads and appends through none of them."""
    ann, _ = accounts
    hub = start(hub_factory, shared_dir, "links")
    token = hub.add_user(ann.pw_name)
    ledger = shared_dir / "links.sqlite"
    plant = [
        "import os",
        "for name in ('output.ipynb', 'output.html', 'job.log', 'state.json'):\n"
        "    try:\n        os.remove(name)\n    except FileNotFoundError:\n        pass\n"
        f"    os.symlink({str(ledger)!r}, name)",
    ]
    body = {"path": "plant.ipynb", "profile": "share-250", "notebook": nb_json(plant)}
    r = hub.api("POST", "/api/jobs", token, json=body)
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    before = ledger.read_bytes()[:100]
    job = wait_state(hub, token, job_id, ("completed", "failed"), timeout=120)
    for fmt in ("ipynb", "html"):
        r = hub.api("GET", f"/api/jobs/{job_id}/output?format={fmt}", token)
        assert r.status_code in (200, 404) and b"SQLite format" not in r.content
    log = hub.api("GET", f"/api/jobs/{job_id}/log", token).json()["log"]
    assert "SQLite format" not in log
    assert ledger.read_bytes()[:100] == before  # nothing appended through job.log
    assert job["state"] in ("completed", "failed")


@pytest.mark.slurm
def test_slurm_jobs_are_submitted_as_their_owners(accounts, shared_dir, slurm, hub_factory):
    ann, _ = accounts
    env = {k: v for k, v in slurm.env.items() if k.startswith("SLURM") or k == "PATH"}
    hub = start(
        hub_factory,
        shared_dir,
        "slurm",
        extra=(f"import os\nos.environ.update({env!r})\nc.GPUSliceService.job_backend = 'slurm'\n"),
        # the ledger's host is the Slurm node (the job is pinned to it); share-250 asks
        # Slurm for shards of one of its A100s
        hosts=slurm_hosts(slurm.node.name),
        profiles=PROFILES,
    )
    token = hub.add_user(ann.pw_name)
    facts = run_probe(hub, token, "", shared_dir, "slurm")
    # slurmd starts a job under the uid that submitted it: ann's, through runuser
    check_isolated(hub, facts, ann, extra_ok=SLURM_ADDED_PREFIXES)
