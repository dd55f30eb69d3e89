"""Job folders on the service side: ``<jobs_root>/<id>/`` with the notebook snapshot and
``job.json``. The folder's layout is :class:`gpuslice.run.jobdir.JobDir`, shared with the
runner that reads it."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import nbformat

from gpuslice.run.jobdir import JobDir

from ..errors import Refused
from .accounts import Account


def read_notebook(content: Any) -> nbformat.NotebookNode:
    """Validate a submitted notebook (its JSON); refused (``bad_request``) with the reason
    when it is not one: where in the notebook, and what is wrong there, in one line."""
    if not isinstance(content, dict):
        raise Refused("bad_request", "field 'notebook' must be a notebook (nbformat JSON object)")
    major = content.get("nbformat")
    if isinstance(major, bool) or major not in (3, 4):
        raise Refused(
            "bad_request",
            "field 'notebook' must be an nbformat 4 notebook (version 3 is converted): its "
            f"'nbformat' is {_short(major)}",
        )
    # (checked first: nbformat's reader fails on these with messages that name neither)
    listed = "cells" if major == 4 else "worksheets"
    items = content.get(listed)
    if not isinstance(items, list):
        raise Refused(
            "bad_request",
            f"field 'notebook' is not a valid nbformat {major} notebook: its '{listed}' must "
            f"be a list, not {_short(items)}",
        )
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise Refused(
                "bad_request",
                f"field 'notebook' is not a valid nbformat {major} notebook: {listed}/{i} "
                f"must be an object, not {_short(item)}",
            )
    try:
        nb = nbformat.from_dict(content)
        if major != 4:
            nb = nbformat.convert(nb, 4)
        nbformat.validate(nb)
    except nbformat.ValidationError as e:
        # the schema's message, not its dump of the schema and the whole instance
        where = "/".join(str(part) for part in getattr(e, "absolute_path", ()) or ())
        what = str(getattr(e, "message", "") or e).splitlines()[0]
        raise Refused(
            "bad_request",
            f"field 'notebook' is not a valid notebook: {where + ': ' if where else ''}{what}"[
                :500
            ],
        ) from None
    except Exception as e:
        # (nbformat's converter and reader fail with KeyError, TypeError, ... on odd input)
        what = f"missing {e.args[0]!r}" if isinstance(e, KeyError) and e.args else str(e)
        raise Refused(
            "bad_request",
            f"field 'notebook' is not a valid nbformat {major} notebook: "
            f"{what.splitlines()[0] if what else type(e).__name__}"[:500],
        ) from None
    if not any(c.get("cell_type") == "code" for c in nb.cells):
        raise Refused("bad_request", "the notebook has no code cells to run")
    return nb


def _short(value: Any) -> str:
    """``value`` as a message shows it: a number or a string (cut), else its JSON kind."""
    if value is None or isinstance(value, int | float | str):
        text = json.dumps(value)
        return text if len(text) <= 40 else text[:40] + "..."
    return (
        "an object"
        if isinstance(value, dict)
        else "a list"
        if isinstance(value, list)
        else (type(value).__name__)
    )


def set_aside_stale(folder: Path) -> Path | None:
    """Move a folder already at a new job's place out of the way, kept (where it went, or
    None). No job of this ledger has the id: the folder was left by another ledger over the
    same ``jobs_root`` (a new ``db_url``), or by a submission that failed once its folder was
    made. Without this, every submission after it fails on the same id."""
    if not (folder.exists() or folder.is_symlink()):
        return None
    aside = folder.with_name(f"{folder.name}.stale-{time.strftime('%Y%m%dT%H%M%S')}")
    folder.rename(aside)
    return aside


def create_job_dir(
    root: Path, job_id: int, nb: nbformat.NotebookNode, spec: dict[str, Any], owner: Account
) -> Path:
    """The job's folder, 0700 and the owner's: nobody else can read its notebook, outputs
    or checkpoints. Its files are written before it is handed over, so the owner's code
    never races the service inside it: the folder is new (``exist_ok=False``: nothing can
    be planted in it beforehand, in a jobs root only the service writes) and the service's
    alone until its last ``chown``, so the paths written and chown'ed here name the files
    just made.

    Its owner is the service's record of whose account the job runs as
    (:func:`folder_mismatch`): only root can give a folder away."""
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


def folder_mismatch(root: Path, job: Any, account: Account) -> str:
    """Why ``job`` (a ledger row: its ``id``, ``user`` and ``job_dir``) must not run as
    ``account``, or "" when it may: the row must name ``account`` and the folder the
    service made for the job at submission (``root/<id>``, not a link), and that folder
    must be ``account``'s. Whoever can write the ledger can rewrite a row's ``user`` and
    ``job_dir``, not the owner of a folder the service made and handed over."""
    folder = root / str(job.id)
    if job.user != account.name:
        return f"the ledger names {job.user} as its owner, not {account.name}"
    if job.job_dir != str(folder):
        return f"its folder in the ledger is {job.job_dir!r}, not {str(folder)!r}"
    try:
        st = os.stat(folder, follow_symlinks=False)
    except OSError as e:
        return f"its folder {folder} cannot be examined ({e.strerror})"
    if not stat.S_ISDIR(st.st_mode):
        return f"{folder} is not a folder"
    if st.st_uid != account.uid:
        return (
            f"its folder {folder} belongs to uid {st.st_uid}, not to {account.name} "
            f"(uid {account.uid})"
        )
    return ""
