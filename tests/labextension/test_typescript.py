"""The labextension's own checks (Jest units, type check, eslint, prettier), run from pytest so
that `make test` and CI run them: skipped without npm on a laptop, a failure in CI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.harness.engines import need

LABEXT = Path(__file__).resolve().parents[2] / "labextension"


@pytest.fixture(scope="module")
def npm() -> str:
    path = shutil.which("npm")
    need(path is not None, "npm (Node.js)")
    assert path is not None
    if not (LABEXT / "node_modules" / ".package-lock.json").exists():
        subprocess.run([path, "ci", "--no-audit", "--no-fund"], cwd=LABEXT, check=True, timeout=600)
    return path


def run(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=LABEXT, capture_output=True, text=True, timeout=300, check=False
    )


def check(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 0, f"{' '.join(result.args)}:\n{result.stdout}\n{result.stderr}"


def test_jest_units_pass(npm: str) -> None:
    result = run(npm, "test", "--", "--ci")
    check(result)
    # Jest prints its summary on stderr; make sure tests ran rather than none being found.
    assert "Tests:" in result.stderr and " passed" in result.stderr


def test_typescript_type_checks(npm: str) -> None:
    check(run("npx", "--no-install", "tsc", "--noEmit", "-p", "."))


def test_eslint_clean(npm: str) -> None:
    check(run("npx", "--no-install", "eslint", "."))


def test_prettier_clean(npm: str) -> None:
    check(run("npx", "--no-install", "prettier", "--check", "."))


# The hub service's admin panel script is plain JavaScript served as is; the same tools check
# it, run from the repository root (ESLint only lints files under the directory it runs in).
ADMIN_STATIC = "jupyterhub_ext/gpuslice_hub/static"


def run_at_root(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    binary = str(LABEXT / "node_modules" / ".bin" / tool)
    return subprocess.run(
        [binary, *args], cwd=LABEXT.parent, capture_output=True, text=True, timeout=300
    )


def test_admin_panel_script_eslint_clean(npm: str) -> None:
    check(run_at_root("eslint", "-c", "labextension/eslint.admin.config.mjs", ADMIN_STATIC))


def test_admin_panel_static_prettier_clean(npm: str) -> None:
    config = "labextension/.prettierrc.json"
    check(run_at_root("prettier", "--config", config, "--check", ADMIN_STATIC))
