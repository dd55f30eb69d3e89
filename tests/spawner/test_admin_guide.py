"""The example configs in docs/admin-guide.md load, name real traits, and fit together.

Each ``<!-- example: <launcher>/<file> -->`` block is executed like JupyterHub and the service
execute their config files; every ``c.<Class>.<trait>`` it sets must be a configurable trait
of that class, the spawner it selects must load and accept its settings, and the service
config must pass the service's own validation with every profile placeable on its hosts.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from jupyterhub.app import JupyterHub
from jupyterhub.auth import Authenticator
from jupyterhub.proxy import ConfigurableHTTPProxy
from jupyterhub.spawner import LocalProcessSpawner, Spawner
from traitlets.config import Config

from gpuslice_hub.app import GPUSliceService
from gpuslice_hub.hubconfig import share_sections
from gpuslice_spawner import GPUSliceMixin, GPUSliceSpawner
from gpuslice_spawner.kubernetes_resources import KubernetesResourcesConfig
from gpuslice_spawner.slurm_gres import SlurmGresConfig

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "admin-guide.md"
EXAMPLE = re.compile(r"<!-- example: (\S+) -->\n```python\n(.*?)\n```", re.S)
LAUNCHERS = {
    "local": "gpuslice",
    "kubernetes": "gpuslice-kubernetes",
    "hami": "gpuslice-kubernetes",
    "slurm": "gpuslice-slurm",
}


def examples() -> dict[str, str]:
    found = dict(EXAMPLE.findall(GUIDE.read_text()))
    return found


def test_the_guide_has_both_files_for_every_launcher():
    names = set(examples())
    assert names == {
        f"{k}/{f}" for k in LAUNCHERS for f in ("jupyterhub_config.py", "gpuslice_config.py")
    }


def load(source: str) -> Config:
    c = Config()
    exec(compile(source, "<admin-guide example>", "exec"), {"c": c, "get_config": lambda: c})
    return c


def configurable_classes() -> dict[str, type]:
    from kubespawner import KubeSpawner

    from gpuslice_spawner.kubernetes import GPUSliceKubeSpawner
    from gpuslice_spawner.slurm import GPUSliceSlurmSpawner

    classes: list[type] = [
        KubernetesResourcesConfig,
        SlurmGresConfig,
        JupyterHub,
        Authenticator,
        ConfigurableHTTPProxy,
        Spawner,
        LocalProcessSpawner,
        KubeSpawner,
        GPUSliceMixin,
        GPUSliceSpawner,
        GPUSliceKubeSpawner,
        GPUSliceSlurmSpawner,
    ]
    return {cls.__name__: cls for cls in classes}


def make_spawner(cls: type, config: Config) -> Any:
    user = SimpleNamespace(name="alice", id=1, url="/user/alice/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    if cls.__name__ == "GPUSliceKubeSpawner":
        import kubespawner.spawner as ks

        with mock.patch.object(ks, "load_config"), mock.patch.object(ks, "shared_client"):
            return cls(_mock=True, user=user, hub=hub, config=config)
    return cls(user=user, hub=hub, config=config)


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_hub_config_sets_only_real_traits_and_selects_the_launcher(launcher: str, tmp_path: Path):
    c = load(examples()[f"{launcher}/jupyterhub_config.py"])
    # what configure_jupyterhub copies from the service's file (at its real path on a site)
    service = tmp_path / "gpuslice_config.py"
    service.write_text(examples()[f"{launcher}/gpuslice_config.py"])
    share_sections(c, str(service))
    classes = configurable_classes()
    for section, values in c.items():
        assert section in classes, f"{launcher}: c.{section} is not a class this guide expects"
        traits = classes[section].class_trait_names(config=True)
        for name in values:
            assert name in traits, f"{launcher}: c.{section}.{name} is not a configurable trait"

    assert c.JupyterHub.spawner_class == LAUNCHERS[launcher]
    hub = JupyterHub(config=c)
    spawner_class = hub.spawner_class  # resolves the entry point
    assert issubclass(spawner_class, GPUSliceMixin)
    services = {s["name"]: s for s in c.JupyterHub.services}
    assert services["gpuslice"]["command"][-1] == "/etc/jupyterhub/gpuslice_config.py"
    # the spawner accepts every value (traitlets validates enums, types, ...)
    spawner = make_spawner(spawner_class, c)
    assert spawner.service_url.endswith("/services/gpuslice/")
    if launcher in ("kubernetes", "hami", "slurm"):
        # servers off the hub host need a service URL they can reach
        assert spawner.server_service_url.endswith("/services/gpuslice/")
    if launcher == "hami":
        assert spawner.kubernetes_resources().share_mode == "hami"


@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_service_config_passes_validation_and_every_profile_fits(launcher: str, tmp_path: Path):
    path = tmp_path / "gpuslice_config.py"
    path.write_text(examples()[f"{launcher}/gpuslice_config.py"])
    app = GPUSliceService(config_file=str(path))
    app.load_settings()  # the service's own parsing: unknown keys and bad values fail here
    assert app.parsed_profiles
    if app.gpu_backend == "nvml":
        assert not app.hosts
        return  # nvml: the GPUs come from the driver, so there is no declared inventory to check
    app.db_url = f"sqlite:///{tmp_path}/ledger.sqlite"  # not the example's production database
    app.open_ledger()
    assert app.ledger is not None
    app.ledger.sync_inventory(app.discover())
    groups = {g for p in app.parsed_profiles.values() for g in p.groups}
    for entry in app.ledger.availability("someone", groups):
        assert entry["total"] > 0, f"{launcher}: profile {entry['name']} fits on no host"


def test_the_service_settings_table_covers_every_service_trait():
    text = GUIDE.read_text()
    start = text.index("## Service settings reference")
    table = text[start : text.index("\n## ", start + 1)]
    own = {
        name
        for name, trait in GPUSliceService.class_traits(config=True).items()
        if trait.this_class is GPUSliceService and name != "config_file"
    }
    missing = sorted(n for n in own if f"`{n}`" not in table)
    assert not missing, f"docs/admin-guide.md does not describe GPUSliceService.{missing}"


def test_the_batch_job_settings_table_covers_every_job_manager_trait():
    from gpuslice_hub.jobs.manager import JobManager

    text = GUIDE.read_text()
    start = text.index("## Batch job settings reference")
    table = text[start : text.index("\n## ", start + 1)]
    own = {
        name
        for name, trait in JobManager.class_traits(config=True).items()
        if trait.this_class is JobManager
    }
    missing = sorted(n for n in own if f"`{n}`" not in table)
    assert not missing, f"docs/admin-guide.md does not describe JobManager.{missing}"
