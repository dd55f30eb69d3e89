"""The labextension shows exactly the job states the service emits (issue 48: it had badges
for five states the service never had), as docs/openapi.yaml names them."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpuslice.vocab import JOB_STATES

REPO = Path(__file__).resolve().parents[2]


def test_the_labextensions_badges_are_the_documented_job_states():
    spec = yaml.safe_load((REPO / "docs" / "openapi.yaml").read_text())
    documented = spec["components"]["schemas"]["Job"]["properties"]["state"]["enum"]
    source = (REPO / "labextension" / "src" / "jobview.ts").read_text()
    table = re.search(r"export const BADGES[^{]*\{(.*?)\n\};", source, re.S)
    assert table, "BADGES not found in jobview.ts"
    badges = re.findall(r"^\s*'?([a-z-]+)'?: \{ label", table.group(1), re.M)
    assert badges == documented == list(JOB_STATES)
