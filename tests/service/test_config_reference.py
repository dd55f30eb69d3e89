"""The configuration reference is generated from the traits, and the hand-written summaries
in the admin guide name only settings that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from traitlets import HasTraits

from gpuslice_hub.configdocs import SECTIONS, reference

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_reference_in_the_docs_is_what_the_code_generates():
    assert (DOCS / "config-reference.md").read_text() == reference(), (
        "docs/config-reference.md is stale: python -m gpuslice_hub.configdocs > "
        "docs/config-reference.md"
    )


@pytest.mark.parametrize(
    ("heading", "cls"),
    [
        ("## Service settings reference", "GPUSliceService"),
        ("## Batch job settings reference", "JobManager"),
    ],
)
def test_the_admin_guide_summaries_name_only_real_settings(heading, cls):
    import importlib

    module = next(m for m, name, _, _ in SECTIONS if name == cls)
    traits = set(getattr(importlib.import_module(module), cls).class_traits(config=True))
    guide = (DOCS / "admin-guide.md").read_text()
    section = guide.split(heading, 1)[1].split("\n## ", 1)[0]
    named = {
        name
        for row in section.splitlines()
        if row.startswith("| `")
        for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])
    }
    assert named and named <= traits, sorted(named - traits)


def test_every_documented_class_has_help_for_every_setting():
    import importlib

    for module, name, _, _ in SECTIONS:
        cls: type[HasTraits] = getattr(importlib.import_module(module), name)
        missing = [t for t, trait in cls.class_own_traits(config=True).items() if not trait.help]
        assert not missing, (name, missing)


def service_command(*args: str) -> str:
    """What ``gpuslice-hub-service ARGS`` prints (it must exit 0)."""
    return subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout


def test_generate_config_writes_every_service_and_job_setting():
    out = service_command("--generate-config")
    assert "# c.GPUSliceService.reconcile_interval = 60.0" in out
    assert "# c.JobManager.preempt_grace = 60.0" in out


def test_help_names_generate_config():
    # (issue 48: the one way to a starting config file was in no --help)
    said = service_command("--help")
    assert "--generate-config\n    Print a commented gpuslice_config.py" in said
