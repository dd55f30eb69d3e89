"""Job folders on the service side: ``<jobs_root>/<id>/`` with the notebook snapshot and
``job.json``. The folder's layout is :class:`gpuslice.run.jobdir.JobDir`, shared with the
runner that reads it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import nbformat

from gpuslice.run.jobdir import JobDir

from ..errors import RequestError


def read_notebook(content: Any) -> nbformat.NotebookNode:
    """Validate a submitted notebook (its JSON); 400 with the reason when it is not one."""
    if not isinstance(content, dict):
        raise RequestError(400, "field 'notebook' must be a notebook (nbformat JSON object)")
    try:
        nb = nbformat.from_dict(content)
        if nb.get("nbformat") != 4:
            nb = nbformat.convert(nb, 4)
        nbformat.validate(nb)
    except Exception as e:
        raise RequestError(400, f"field 'notebook' is not a valid notebook: {e}"[:500]) from None
    if not any(c.get("cell_type") == "code" for c in nb.cells):
        raise RequestError(400, "the notebook has no code cells to run")
    return nb


def create_job_dir(
    root: Path, job_id: int, nb: nbformat.NotebookNode, spec: dict[str, Any]
) -> Path:
    jd = JobDir(root / str(job_id))
    jd.root.mkdir(parents=True, exist_ok=False, mode=0o700)
    nbformat.write(nb, jd.input_path)
    jd.spec_path.write_text(json.dumps({"id": job_id, **spec}, indent=1))
    return jd.root
