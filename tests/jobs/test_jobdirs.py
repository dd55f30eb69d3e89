"""A submitted notebook's folder (``jobs/jobdirs.py``), and the account it is made for."""

from __future__ import annotations

import json
import logging
import os
import pwd
import stat

import nbformat
import pytest

from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.accounts import Account
from gpuslice_hub.jobs.jobdirs import create_job_dir, read_notebook
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.ledger import Caller


def _submitted() -> dict:
    nb = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Entraînement ☃\nsecond line"),
            nbformat.v4.new_code_cell("import math\nprint(math.pi)"),
        ],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}},
    )
    return json.loads(nbformat.writes(nb))


def test_the_folder_holds_the_notebook_as_nbformat_writes_it(tmp_path):
    nb = read_notebook(_submitted())
    spec = {"name": "train", "parameters": {"lr": 0.1}}
    root = create_job_dir(tmp_path, 7, nb, spec, Account.current())
    written = (root / "input.ipynb").read_bytes()
    # byte for byte nbformat's own file (written once validated, not validated twice)
    expected = tmp_path / "expected.ipynb"
    nbformat.write(nb, expected)
    assert written == expected.read_bytes()
    back = nbformat.read(root / "input.ipynb", as_version=4)
    assert [c.source for c in back.cells] == [
        "# Entraînement ☃\nsecond line",
        "import math\nprint(math.pi)",
    ]
    assert json.loads((root / "job.json").read_text()) == {"id": 7, **spec}
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_a_notebook_that_is_not_one_is_refused_with_the_reason(tmp_path):
    bad = _submitted()
    bad["cells"][1]["source"] = 42
    with pytest.raises(Refused) as e:
        read_notebook(bad)
    assert e.value.code == "bad_request" and "not a valid notebook" in e.value.message
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # the version: named, never nbformat's internals ("5", "(None, None)", "'worksheets'")
        (
            {"nbformat": 5},
            "must be an nbformat 4 notebook (version 3 is converted): its 'nbformat' is 5",
        ),
        ({"nbformat": 1e300}, "its 'nbformat' is 1e+300"),
        ({"nbformat": True}, "its 'nbformat' is true"),
        ({"nbformat": "4"}, "its 'nbformat' is \"4\""),
        (
            {"nbformat": 3},
            "not a valid nbformat 3 notebook: its 'worksheets' must be a list, not null",
        ),
        (
            {"cells": "nope"},
            "not a valid nbformat 4 notebook: its 'cells' must be a list, not \"nope\"",
        ),
        ({"cells": [{}, ["x"]]}, "cells/1 must be an object, not a list"),
        # the schema's finding, where it is: one line, no dump of the schema or the notebook
        ({"metadata": None}, "not a valid notebook: metadata: None is not of type 'object'"),
    ],
)
def test_a_refused_notebook_is_told_what_is_wrong_and_where(change, message):
    bad = {**_submitted(), **change}
    with pytest.raises(Refused) as e:
        read_notebook(bad)
    assert e.value.code == "bad_request"
    assert message in e.value.message and "\n" not in e.value.message, e.value.message
    assert e.value.message.startswith("field 'notebook' ")


def test_the_service_account_is_looked_up_once_per_effective_uid(monkeypatch):
    from gpuslice_hub.jobs import accounts

    looked: list[int] = []
    real = pwd.getpwuid

    def getpwuid(uid: int):  # type: ignore[no-untyped-def]
        looked.append(uid)
        return real(os.getuid())

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    monkeypatch.setattr(accounts, "_CURRENT", {})
    me = Account.current()
    assert Account.current() is me and looked == [os.geteuid()]
    # another effective uid (a service that dropped privileges) is another account
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    other = Account.current()
    assert looked == [me.uid, 4242]
    assert Account.current() is other


def test_a_folder_left_at_a_new_jobs_place_is_set_aside_not_a_failure_per_submission(
    tmp_path, caplog
):
    # another ledger's job 1 over the same jobs_root (the admin changed db_url): every
    # submission failed on its folder, with a 500, for good
    from tests.jobs.test_burst import FakeSlurm
    from tests.jobs.test_jobs_hub import nb_json
    from tests.service.conftest import build_ledger

    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    root = tmp_path / "jobs"
    (root / "1").mkdir(parents=True)
    (root / "1" / "output.ipynb").write_text("the other ledger's result")
    jobs = JobManager(ledger, ledger.db, FakeSlurm(), root)  # type: ignore[arg-type]
    jobs.run_jobs_as_service_user = True
    # a logger of its own: the suite's traitlets applications stop theirs propagating
    jobs.log = logging.getLogger("test-jobdirs")
    try:
        with caplog.at_level(logging.WARNING):
            job = jobs.submit(
                Caller("ann", (), "ann"), {"notebook": nb_json(["1"]), "profile": "gpu-1"}
            )
        assert job["id"] == 1 and (root / "1" / "input.ipynb").is_file()
        (aside,) = root.glob("1.stale-*")
        assert (aside / "output.ipynb").read_text() == "the other ledger's result"  # kept
        assert f"moved that folder to {aside}" in caplog.text
    finally:
        ledger.db.dispose()
