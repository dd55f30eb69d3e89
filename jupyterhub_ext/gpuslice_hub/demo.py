"""`make demo`: JupyterHub + gpuslice on their embedded defaults, on http://127.0.0.1:8000.

Uses the GPUs of this machine through NVML when a driver is present; otherwise the
``simulated`` backend, declared here and labelled as simulated everywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

from gpuslice.gpu import discover, nvml_available

DEMO_DIR = Path(os.environ.get("GPUSLICE_DEMO_DIR", ".demo")).resolve()
PASSWORD = "gpuslice"

SIMULATED_HOSTS = [
    {
        "name": "sim-node-1",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2},
        ],
    }
]


# A demo setting: idle reclaim seen in one sitting. The real profiles below wait 30 or 60
# minutes (a warning 5 minutes before), too long to watch while trying the product out.
IDLE_DEMO_PROFILE = "demo-idle-2min"
IDLE_DEMO_TIMEOUT = 120  # seconds idle on the GPU before the server is stopped
IDLE_DEMO_WARNING = 60  # seconds before that, the warning


def profiles_for(inventory: Any) -> list[dict[str, Any]]:
    """One profile per MIG profile present, plus a quarter share and a whole GPU, and a copy
    of the first of the quarter share and the MIG profiles with a short idle timeout, labelled
    as the demo setting it is (``idle_policy_for`` gives it its warning and action)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    plain = [g for g in inventory.gpus() if not g.is_mig]
    for g in inventory.gpus():
        for m in g.mig_instances:
            if m.profile not in seen:
                seen.add(m.profile)
                out.append(
                    {
                        "name": f"mig-{m.profile}",
                        "display_name": f"MIG {m.profile}",
                        "description": f"A MIG instance {m.profile} of an {g.model}",
                        "kind": "mig",
                        "mig_profile": m.profile,
                        "idle_timeout": 1800,
                    }
                )
    if plain:
        quarter = max(1024, plain[0].memory_mib // 4)
        out.append(
            {
                "name": "share-250",
                "display_name": "Quarter GPU",
                "description": f"25% of an {plain[0].model}",
                "kind": "share",
                "gpu_milli": 250,
                "gpu_memory_mib": quarter,
                "idle_timeout": 1800,
            }
        )
        out.append(
            {
                "name": "gpu-1",
                "display_name": "Whole GPU",
                "description": f"One whole {plain[0].model}",
                "kind": "gpu",
                "count": 1,
                "idle_timeout": 3600,
            }
        )
    base = next((p for p in out if p["kind"] == "share"), out[0] if out else None)
    if base is not None:
        out.append(
            {
                **base,
                "name": IDLE_DEMO_PROFILE,
                "display_name": f"{base['display_name']}, idle reclaim after 2 min (demo setting)",
                "description": (
                    f"{base['description']}. Demo setting, to see idle reclaim in a sitting: "
                    f"once nothing has run on its GPU for {IDLE_DEMO_WARNING} s, JupyterLab "
                    f"warns; at {IDLE_DEMO_TIMEOUT} s the server stops and its slice goes back "
                    "to the pool, unless a cell runs or you click Keep working (the other "
                    "profiles wait 30 or 60 min)"
                ),
                "idle_timeout": IDLE_DEMO_TIMEOUT,
            }
        )
    return out


def idle_policy_for(profiles: list[dict[str, Any]]) -> dict[str, Any]:
    """The demo's idle policy: the service's defaults, except that the short-timeout demo
    profile warns a minute ahead and stops the whole server (the slice goes back, as idle
    reclaim does at its fullest)."""
    if not any(p["name"] == IDLE_DEMO_PROFILE for p in profiles):
        return {}
    own = {"action": "server", "warning_lead": IDLE_DEMO_WARNING}
    return {"profiles": {IDLE_DEMO_PROFILE: own}}


def write_configs() -> tuple[str, Any, list[dict[str, Any]]]:
    backend = "nvml" if nvml_available() else "simulated"
    hosts = SIMULATED_HOSTS if backend == "simulated" else None
    inventory = discover(backend, hosts)
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    (DEMO_DIR / "home").mkdir(exist_ok=True)
    profiles = profiles_for(inventory)
    service_cfg = {
        "gpu_backend": backend,
        "hosts": hosts or [],
        "profiles": profiles,
        "idle_policy": idle_policy_for(profiles),
        "quotas": {"default_user": {"max_slices": 2}},
        "db_url": f"sqlite:///{DEMO_DIR / 'gpuslice.sqlite'}",
        # a point a minute, so the admin panel's plot fills while you try it out
        "usage_sample_interval": 60,
    }
    (DEMO_DIR / "gpuslice_config.json").write_text(json.dumps(service_cfg, indent=2))
    (DEMO_DIR / "gpuslice_config.py").write_text(
        "import json, pathlib\n"
        "cfg = json.loads((pathlib.Path(__file__).parent / 'gpuslice_config.json').read_text())\n"
        "for key, value in cfg.items():\n"
        "    setattr(c.GPUSliceService, key, value)\n"
        "# Demo only: every demo user is you, so their batch jobs run as your account. A shared\n"
        "# hub runs each job as its owner (see 'Security model' in docs/admin-guide.md).\n"
        "c.JobManager.run_jobs_as_service_user = True\n"
    )
    root = os.getuid() == 0
    chp = shutil.which("configurable-http-proxy") or "configurable-http-proxy"
    (DEMO_DIR / "jupyterhub_config.py").write_text(
        f"""# Written by `make demo` (gpuslice_hub.demo) at each run: a change here is lost.
import sys
from gpuslice_hub.hubconfig import configure_jupyterhub

c.JupyterHub.bind_url = "http://127.0.0.1:8000"
c.JupyterHub.db_url = "sqlite:///{DEMO_DIR / "jupyterhub.sqlite"}"
c.JupyterHub.cookie_secret_file = "{DEMO_DIR / "jupyterhub_cookie_secret"}"
c.JupyterHub.pid_file = "{DEMO_DIR / "jupyterhub.pid"}"
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.Authenticator.allow_all = True
c.Authenticator.admin_users = {{"admin"}}
configure_jupyterhub(
    c,
    config_file="{DEMO_DIR / "gpuslice_config.py"}",
    admin_users={{"admin"}},
    spawner="gpuslice-simple",
)
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.args = {["--allow-root"] if root else []!r}
c.Spawner.default_url = "/lab"
c.SimpleLocalProcessSpawner.home_dir_template = "{DEMO_DIR / "home"}/{{username}}"
"""
    )
    return backend, inventory, profiles


def banner(backend: str, inventory: Any, profiles: list[dict[str, Any]] | None = None) -> str:
    lines = ["", "=" * 72, "gpuslice demo", "=" * 72]
    if inventory.simulated:
        lines.append("GPU backend: simulated — no NVIDIA driver found on this machine, so these")
        lines.append("GPUs are declared in gpuslice_hub/demo.py and are NOT real hardware.")
        lines.append("A kernel's 'GPU utilization' is its CPU use: a busy loop looks busy.")
    else:
        lines.append(f"GPU backend: {backend} (real GPUs of {socket.gethostname()})")
    for host in inventory.hosts:
        lines.append(f"  host {host.name}:")
        for g in host.gpus:
            mig = ", ".join(m.profile for m in g.mig_instances)
            extra = f" — MIG: {mig}" if g.is_mig else ""
            lines.append(f"    GPU {g.index}: {g.model}, {g.memory_mib // 1024} GiB{extra}")
    lines += [
        "",
        "Open  http://127.0.0.1:8000  once the log below says",
        "      'JupyterHub is now running' (a few seconds; before that the proxy answers 404)",
        f"Log in as any user name (e.g. alice) with the password: {PASSWORD}",
        "Log in as 'admin' for the gpuslice admin panel (inventory, jobs, quotas):",
        "      http://127.0.0.1:8000/services/gpuslice/admin",
        *_idle_hint(profiles or []),
        "Demo setting: every user's servers and batch jobs run as YOUR account",
        "(c.JobManager.run_jobs_as_service_user = True). Never use it on a shared machine.",
        f"Config and state: {DEMO_DIR}",
        "Stop with Ctrl-C. Batch jobs still running keep running (as on a real hub,",
        "a job outlives a restart of the service) and the next `make demo` picks them",
        "up: cancel them in the GPU jobs panel first to stop them too.",
        "=" * 72,
        "",
    ]
    return "\n".join(lines)


def _idle_hint(profiles: list[dict[str, Any]]) -> list[str]:
    """How to see idle reclaim without waiting half an hour: the demo profile."""
    demo = next((p for p in profiles if p["name"] == IDLE_DEMO_PROFILE), None)
    if demo is None:
        return []
    return [
        "To see idle reclaim in two minutes (the other profiles wait 30 or 60), pick",
        f"      {demo['display_name']}",
        f"in the spawn form: once nothing has run on its GPU for {IDLE_DEMO_WARNING} s, JupyterLab "
        "warns;",
        f"at {IDLE_DEMO_TIMEOUT} s the server stops and its slice goes back to the pool.",
    ]


def upgrade_demo_database() -> str | None:
    """Bring a database left by an older gpuslice's demo to the newest schema.

    A production service refuses an old schema and names the command (the admin backs up
    first); the demo's database is scratch state, so the demo upgrades it itself.
    """
    from .db.engine import open_database
    from .db.schema import current_revision, head_revision, upgrade

    path = DEMO_DIR / "gpuslice.sqlite"
    if not path.exists():
        return None
    db = open_database(f"sqlite:///{path}")
    try:
        before = current_revision(db)
        if before is None or before == head_revision():
            return None
        upgrade(db)
        return f"Upgraded the demo database {path} from schema {before} to {head_revision()}."
    finally:
        db.dispose()


def main() -> None:
    backend, inventory, profiles = write_configs()
    note = upgrade_demo_database()
    if note:
        print(note, flush=True)
    print(banner(backend, inventory, profiles), flush=True)
    os.chdir(DEMO_DIR)
    args = [sys.executable, "-m", "jupyterhub", "-f", str(DEMO_DIR / "jupyterhub_config.py")]
    os.execv(sys.executable, args)


if __name__ == "__main__":
    main()
