"""The ledger's password is in no file other accounts can read (issue 45).

Found by an attack: ``gpuslice_config.py`` held ``db_url`` with the PostgreSQL ledger's
password and was 0644 (the admin's umask); a user read it and rewrote her job's owner in the
ledger. The service now refuses to start on such a file, naming it and the fix; the password
can come from a 0600 file (``db_password_file``); and ``configure_jupyterhub`` refuses to put
a secret in the hub's database, which stores a service's ``environment`` in plain text.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url
from traitlets.config import Config

from gpuslice_hub.app import GPUSliceService
from gpuslice_hub.errors import ConfigError
from gpuslice_hub.hubconfig import configure_jupyterhub

# (a password that a URL must quote, as many generated ones do)
PASSWORD = "s3cr/t:pw"
DB_URL = "postgresql://gpuslice:s3cr%2Ft%3Apw@127.0.0.1:1/gpuslice"
SETTINGS = """\
c.GPUSliceService.gpu_backend = "simulated"
c.GPUSliceService.hosts = [
    {"name": "n1", "cpu_milli": 8000, "memory_mib": 65536,
     "gpus": [{"model": "A100", "memory_mib": 81920, "count": 1}]}
]
c.GPUSliceService.profiles = [{"name": "gpu-1", "kind": "gpu", "count": 1}]
"""


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default gpuslice_config.py must not exist


def config_file(folder: Path, text: str, mode: int) -> Path:
    path = folder / "gpuslice_config.py"
    path.write_text(SETTINGS + text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604], ids=lambda m: f"{m:04o}")
def test_a_config_file_holding_the_ledger_password_must_be_private(tmp_path, mode):
    path = config_file(tmp_path, f"c.GPUSliceService.db_url = {DB_URL!r}\n", mode)
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config_file=str(path)).load_settings()
    assert e.value.key == "config_file"
    assert str(path) in e.value.message and f"chmod 600 {path}" in e.value.message
    assert f"mode {mode:04o}" in e.value.message and "read" in e.value.message
    path.chmod(0o600)  # the fix the message names
    GPUSliceService(config_file=str(path)).load_settings()


def test_the_service_process_refuses_to_start_and_says_why(tmp_path):
    """As the hub starts it (``python -m gpuslice_hub.app --config ...``): it exits at once
    with the message, before it opens the ledger or listens."""
    path = config_file(tmp_path, f"c.GPUSliceService.db_url = {DB_URL!r}\n", 0o644)
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr
    assert f"gpuslice: invalid configuration: config_file: {path} holds" in r.stderr
    assert f"chmod 600 {path}" in r.stderr
    assert PASSWORD not in r.stderr and "s3cr%2Ft" not in r.stderr  # (never said)


def test_a_config_file_that_does_not_spell_the_password_may_be_read(tmp_path, monkeypatch):
    """A config that takes the password from elsewhere holds no secret itself."""
    monkeypatch.setenv("GPUSLICE_TEST_DB_URL", DB_URL)
    text = "import os\nc.GPUSliceService.db_url = os.environ['GPUSLICE_TEST_DB_URL']\n"
    app = GPUSliceService(config_file=str(config_file(tmp_path, text, 0o644)))
    app.load_settings()
    assert make_url(app.ledger_url()).password == PASSWORD


def password_config(folder: Path, password_mode: int) -> GPUSliceService:
    secret = folder / "ledger-password"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(password_mode)
    text = (
        'c.GPUSliceService.db_url = "postgresql://gpuslice@127.0.0.1:1/gpuslice"\n'
        f"c.GPUSliceService.db_password_file = {str(secret)!r}\n"
    )
    # the config file holds no secret: it may be read by anyone
    app = GPUSliceService(config_file=str(config_file(folder, text, 0o644)))
    app.load_settings()
    return app


def test_the_password_comes_from_a_private_file(tmp_path):
    url = make_url(password_config(tmp_path, 0o600).ledger_url())
    assert (url.username, url.password, url.host) == ("gpuslice", PASSWORD, "127.0.0.1")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o620], ids=lambda m: f"{m:04o}")
def test_a_password_file_others_can_open_is_refused(tmp_path, mode):
    app = password_config(tmp_path, mode)
    with pytest.raises(ConfigError) as e:
        app.ledger_url()
    secret = tmp_path / "ledger-password"
    assert e.value.key == "db_password_file" and f"chmod 600 {secret}" in e.value.message
    assert f"mode {mode:04o}" in e.value.message


def test_the_service_process_refuses_a_password_file_others_can_read(tmp_path):
    """Read when the service opens its ledger, at start: the process exits with the
    message."""
    password_config(tmp_path, 0o644)
    r = subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "--config", "gpuslice_config.py"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 1, r.stderr
    secret = tmp_path / "ledger-password"
    assert f"invalid configuration: db_password_file: {secret} holds" in r.stderr
    assert f"chmod 600 {secret}" in r.stderr


@pytest.mark.parametrize(
    ("argv", "settings", "key", "said"),
    [
        # on the command line, every local user reads it (ps, /proc/<pid>/cmdline)
        (["--db-url", DB_URL], "", "db_url", "on the command line"),
        # two passwords: which one is used would be a guess
        (
            [],
            f"c.GPUSliceService.db_url = {DB_URL!r}\n"
            "c.GPUSliceService.db_password_file = '/nonexistent'\n",
            "db_password_file",
            "too",
        ),
        ([], "c.GPUSliceService.db_password_file = '/nonexistent'\n", "db_password_file", "SQLite"),
    ],
)
def test_a_password_where_it_does_not_belong_is_refused(tmp_path, argv, settings, key, said):
    path = config_file(tmp_path, settings, 0o600)
    with pytest.raises(ConfigError) as e:
        GPUSliceService().initialize(["--config", str(path), *argv])
    assert e.value.key == key and said in e.value.message


@pytest.mark.parametrize(
    "environment",
    [
        {"GPUSLICE_DB_PASSWORD": "s3cret"},
        {"PGPASSWORD": "s3cret"},
        {"LEDGER_TOKEN": "abc"},
        {"GPUSLICE_TEST_DB_URL": DB_URL},
    ],
)
def test_configure_jupyterhub_puts_no_secret_in_the_hubs_database(tmp_path, environment):
    """JupyterHub keeps a managed service's ``environment`` in jupyterhub.sqlite, in plain
    text (0644 by default)."""
    c = Config()
    with pytest.raises(ValueError, match="db_password_file") as e:
        configure_jupyterhub(c, config_file=str(tmp_path / "g.py"), environment=environment)
    assert repr(next(iter(environment))) in str(e.value)
    assert "services" not in c.JupyterHub  # nothing half-configured


def test_configure_jupyterhub_passes_plain_variables(tmp_path):
    c = Config()
    configure_jupyterhub(
        c, config_file=str(tmp_path / "g.py"), environment={"PYTHONUNBUFFERED": "1"}
    )
    (service,) = c.JupyterHub.services
    assert service["environment"]["PYTHONUNBUFFERED"] == "1"
