"""Fixtures: real system accounts (``accounts``, two throwaway users with homes) and a
folder they can search (``shared_dir``), for tests about who runs what. Root only (CI is
root); elsewhere they skip, in CI they fail."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.engines import need


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def accounts() -> Iterator[list[pwd.struct_passwd]]:
    """Two throwaway system accounts with home folders, removed afterwards."""
    need(os.geteuid() == 0, "root (to create system accounts)")
    need(shutil.which("useradd") is not None, "useradd")
    names = [f"gs{secrets.token_hex(3)}{x}" for x in "ab"]
    made = []
    try:
        for name in names:
            r = _run("useradd", "--create-home", "--shell", "/bin/bash", name)
            assert r.returncode == 0, r.stderr
            made.append(name)
        with _reachable_python(names[0]):
            yield [pwd.getpwnam(n) for n in names]
    finally:
        for name in made:
            _run("userdel", "--remove", name)


class _reachable_python:
    """The runner is this checkout's venv Python: make sure another account can run it.

    A checkout or a Python under a private folder (pyenv in /root) is not searchable by
    other users; grant search (o+x, not read) on the folders that lack it, for this module,
    and undo it after. A site installs gpuslice where its users can run it (the service
    checks that at start)."""

    def __init__(self, user: str) -> None:
        self.user = user
        self.changed: list[tuple[Path, int]] = []

    def _works(self) -> bool:
        r = _run("runuser", "-u", self.user, "--", sys.executable, "-c", "import gpuslice.run")
        return r.returncode == 0

    def __enter__(self) -> None:
        if self._works():
            return
        places = (Path(sys.executable).resolve(), Path(sys.base_prefix), Path(REPO_ROOT))
        folders = {p for place in places for p in place.resolve().parents} | {Path(REPO_ROOT)}
        for folder in sorted(folders):
            mode = stat.S_IMODE(folder.stat().st_mode)
            if not mode & 0o001:
                self.changed.append((folder, mode))
                folder.chmod(mode | 0o001)
        assert self._works(), f"{self.user} cannot run {sys.executable}"

    def __exit__(self, *exc: object) -> None:
        for folder, mode in reversed(self.changed):
            folder.chmod(mode)


REPO_ROOT = str(Path(__file__).resolve().parents[2])  # the checkout


@pytest.fixture(scope="module")
def shared_dir() -> Iterator[Path]:
    """A folder other accounts can search (unlike pytest's tmp_path under /tmp/pytest-of-root),
    for the ledger and the jobs root: only the modes gpuslice sets protect what is inside."""
    d = Path(tempfile.mkdtemp(prefix="gpuslice-accounts-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)
