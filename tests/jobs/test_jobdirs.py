"""A submitted notebook's folder (``jobs/jobdirs.py``), and the account it is made for."""

from __future__ import annotations

import json
import os
import pwd
import stat

import nbformat
import pytest

from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.accounts import Account
from gpuslice_hub.jobs.jobdirs import create_job_dir, read_notebook


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
