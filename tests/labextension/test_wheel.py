"""The wheel ships the prebuilt labextension: installed into a fresh venv on a PATH without
Node.js, JupyterLab lists it as enabled and OK (and the server extension too, once it exists).
The wheel is built the way a site's pip builds it from PyPI's sdist: from the sdist, with
no Node.js on the PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from tests.harness.engines import need

REPO = Path(__file__).resolve().parents[2]
LABEXT_OUT = REPO / "server_ext" / "gpuslice" / "labextension"
SHARE = "share/jupyter/labextensions/gpuslice-labextension"
ANSI = re.compile(r"\x1b\[[0-9;]*m")

pytestmark = pytest.mark.timeout(900)


def without_node_path() -> str:
    """The current PATH minus every folder that holds node or npm."""
    keep = [
        folder
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder
        and not any(os.access(os.path.join(folder, exe), os.X_OK) for exe in ("node", "npm"))
    ]
    return os.pathsep.join(keep)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (LABEXT_OUT / "package.json").exists():
        # The build hook would have to run npm; without it the wheel cannot carry the UI.
        need(shutil.which("npm") is not None, "npm (to build the labextension)")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(REPO)],
        check=True,
        timeout=900,
        capture_output=True,
    )
    (sdist,) = out.glob("gpuslice-*.tar.gz")
    env = {**os.environ, "PATH": without_node_path()}
    assert shutil.which("npm", path=env["PATH"]) is None
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(sdist)],
        check=True,
        timeout=900,
        env=env,
    )
    (built,) = out.glob("gpuslice-*.whl")
    return built


def test_wheel_carries_the_prebuilt_labextension_once(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    data = [n for n in names if f".data/data/{SHARE}/" in n]
    assert any(n.endswith(f"{SHARE}/package.json") for n in data)
    assert any(n.endswith(f"{SHARE}/install.json") for n in data)
    assert any(re.search(r"/static/remoteEntry\.[0-9a-f]+\.js$", n) for n in data)
    assert any(n.endswith(f"{SHARE}/schemas/gpuslice-labextension/plugin.json") for n in data)
    # Not a second copy inside the Python package.
    assert not [n for n in names if n.startswith("gpuslice/labextension/")]
    # No test doubles or benchmark code in what a site installs.
    assert not [n for n in names if n.startswith(("gpuslice/testing/", "gpuslice_hub/bench/"))]
    assert not [n for n in names if "fake_pynvml" in n or n.startswith(("tests/", "benchmarks/"))]
    # The hub service's admin panel page and its script, and the database migrations.
    for name in (
        "gpuslice_hub/templates/admin.html",
        "gpuslice_hub/static/admin.js",
        "gpuslice_hub/static/admin.css",
        "gpuslice_hub/migrations/versions/0003_admin.py",
        "gpuslice_hub/migrations/versions/0005_history.py",
        "gpuslice_hub/migrations/versions/0006_time_windows.py",
        "gpuslice_spawner/templates/spawn_form.html",
    ):
        assert name in names, name


def test_python_and_npm_share_one_version(wheel: Path) -> None:
    """The version comes from labextension/package.json alone (hatch-nodejs-version): the
    wheel's metadata, the labextension it ships and the installed package all say it."""
    npm_version = json.loads((REPO / "labextension" / "package.json").read_text())["version"]
    archive = zipfile.ZipFile(wheel)
    (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
    match = re.search(r"^Version: (\S+)$", archive.read(metadata).decode(), re.MULTILINE)
    # PEP 440 normalises npm's "1.0.0-alpha.1" to "1.0.0a1"
    assert match and Version(match.group(1)) == Version(npm_version)
    (shipped,) = [n for n in archive.namelist() if n.endswith(f"{SHARE}/package.json")]
    assert json.loads(archive.read(shipped))["version"] == npm_version
    assert not (REPO / "server_ext" / "gpuslice" / "_version.py").read_text().count(npm_version)


def test_installed_without_node_the_extension_is_enabled_and_ok(
    wheel: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    # Its dependencies (JupyterLab and the rest) come from this test run's environment
    # through a .pth file: downloading and installing them again took most of a minute and
    # tests pip, not the wheel. The wheel itself is installed into the new prefix, so its
    # labextension lands where JupyterLab looks for the new venv's.
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    here = sysconfig.get_paths()["purelib"]
    (Path(site) / "_test_env_deps.pth").write_text(here + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            str(wheel),
        ],
        check=True,
        timeout=900,
    )
    # every dependency the wheel declares is there (as pip would have resolved it)
    check = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "gpuslice" not in check.stdout, check.stdout
    path = os.pathsep.join([str(env_dir / "bin"), without_node_path()])
    assert shutil.which("node", path=path) is None
    assert shutil.which("npm", path=path) is None
    env = {
        "PATH": path,
        "HOME": str(tmp_path / "home"),
        # Only the new venv's config and data: nothing from this checkout's .venv or ~/.jupyter.
        "JUPYTER_CONFIG_DIR": str(tmp_path / "home" / ".jupyter"),
        "JUPYTER_DATA_DIR": str(tmp_path / "home" / "data"),
        "JUPYTER_PLATFORM_DIRS": "1",
    }

    def jupyter(*module_and_args: str) -> str:
        result = subprocess.run(
            [str(python), "-m", *module_and_args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return ANSI.sub("", result.stdout + result.stderr)

    # the wheel's gpuslice, not this checkout's
    where = subprocess.run(
        [str(python), "-c", "import gpuslice; print(gpuslice.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert where.startswith(str(env_dir)), where

    labs = jupyter("jupyterlab.labextensions", "list")
    line = next((ln for ln in labs.splitlines() if "gpuslice-labextension" in ln), None)
    assert line is not None, labs
    assert re.search(r"gpuslice-labextension v\S+ enabled OK \(python, gpuslice\)", line), line
    assert str(env_dir / "share" / "jupyter" / "labextensions") in labs

    if (REPO / "server_ext" / "gpuslice" / "extension").is_dir():
        servers = jupyter("jupyter_server.extension.serverextension", "list")
        assert re.search(r"^\s*gpuslice enabled\s*$", servers, re.M), servers
        assert re.search(r"^\s*gpuslice \S+ OK\s*$", servers, re.M), servers
