"""Job folders on the service side: ``<jobs_root>/<id>/`` with the notebook snapshot and
``job.json``. The folder's layout is :class:`gpuslice.run.jobdir.JobDir`, shared with the
runner that reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nbformat

from gpuslice.run.jobdir import JobDir

from ..errors import Refused
from .accounts import Account


def read_notebook(content: Any) -> nbformat.NotebookNode:
    """Validate a submitted notebook (its JSON); refused (``bad_request``) with the reason
    when it is not one."""
    if not isinstance(content, dict):
        raise Refused("bad_request", "field 'notebook' must be a notebook (nbformat JSON object)")
    try:
        nb = nbformat.from_dict(content)
        if nb.get("nbformat") != 4:
            nb = nbformat.convert(nb, 4)
        nbformat.validate(nb)
    except Exception as e:
        raise Refused(
            "bad_request", f"field 'notebook' is not a valid notebook: {e}"[:500]
        ) from None
    if not any(c.get("cell_type") == "code" for c in nb.cells):
        raise Refused("bad_request", "the notebook has no code cells to run")
    return nb


def create_job_dir(
    root: Path, job_id: int, nb: nbformat.NotebookNode, spec: dict[str, Any], owner: Account
) -> Path:
    """The job's folder, 0700 and the owner's: nobody else can read its notebook, outputs
    or checkpoints. Its files are written before it is handed over, so the owner's code
    never races the service inside it."""
    jd = JobDir(root / str(job_id))
    jd.root.mkdir(exist_ok=False, mode=0o700)
    # nbformat's own JSON (lines split, keys sorted), without ``nbformat.write``'s second
    # validation: ``read_notebook`` validated it, and that one only logs (it was about 40 %
    # of the cost of a submission's folder)
    text = nbformat.v4.writes(nb)
    jd.input_path.write_text(text if text.endswith("\n") else text + "\n", encoding="utf8")
    jd.spec_path.write_text(json.dumps({"id": job_id, **spec}, indent=1))
    jd.log_path.touch()
    if not owner.is_current:
        for path in (jd.input_path, jd.spec_path, jd.log_path, jd.root):
            os.chown(path, owner.uid, owner.gid)
    return jd.root
