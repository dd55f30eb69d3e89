"""Fixture: a throwaway PostgreSQL server.

``postgres_url`` (session) starts one server per test session: initdb into a temp dir,
``pg_ctl start`` on a random 127.0.0.1 port with its unix socket in that dir, stopped at
the end of the session whatever happened. ``postgres_db`` (function) creates a fresh
``test_<random>`` database on it for one test and drops it afterwards.

PostgreSQL refuses to run as root, and CI runs as root: then the server runs as the
``postgres`` system user (created by the Debian package) through ``runuser``, and the temp
dir is handed to that user. As any other user the server simply runs as that user.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.engines import need
from tests.harness.markers import require
from tests.harness.ports import free_ports

START_TIMEOUT = 60.0
SERVICE_USER = "postgres"


def find_bindir() -> Path | None:
    """The directory holding initdb/pg_ctl: pg_config's answer, else Debian's layout."""
    candidates: list[str] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            candidates.append(
                subprocess.run(
                    [pg_config, "--bindir"], capture_output=True, text=True, timeout=10
                ).stdout.strip()
            )
    # Debian keeps server binaries out of PATH; newest major version first
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(p.split("/")[-2]) if p.split("/")[-2].isdigit() else 0,
        reverse=True,
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        if (
            candidate
            and (Path(candidate) / "initdb").is_file()
            and (Path(candidate) / "pg_ctl").is_file()
        ):
            return Path(candidate)
    return None


@dataclass
class PostgresServer:
    bindir: Path
    root: Path
    port: int
    user: str | None  # system user the server runs as; None: the current user

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def logfile(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def conninfo(self, database: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={database}"

    def _run(self, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        prefix = ["runuser", "-u", self.user, "--"] if self.user else []
        cmd = [*prefix, str(self.bindir / argv[0]), *argv[1:]]
        # cwd: the service user may not be able to enter the caller's directory
        return subprocess.run(
            cmd, cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False
        )

    def initdb(self) -> None:
        proc = self._run(
            "initdb",
            f"--pgdata={self.datadir}",
            "--username=postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C",
            "--no-sync",  # a throwaway cluster need not survive a power cut
        )
        if proc.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{proc.stdout}\n{proc.stderr}")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=100"
        )
        # -W: don't let pg_ctl wait; readiness is polled below with our own deadline
        proc = self._run(
            "pg_ctl",
            "start",
            "-W",
            f"--pgdata={self.datadir}",
            f"--log={self.logfile}",
            f"--options={options}",
        )
        if proc.returncode != 0:
            raise RuntimeError(f"pg_ctl start failed:\n{proc.stdout}\n{proc.stderr}")
        self.wait_ready()

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        import psycopg

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                with psycopg.connect(self.conninfo(), connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
                return
            except psycopg.OperationalError as exc:
                last = exc
            if self._failed_to_start():
                break
            time.sleep(0.1)
        raise RuntimeError(f"PostgreSQL did not accept connections: {last}\n{self.log_tail()}")

    def _failed_to_start(self) -> bool:
        # our own early connection attempts log "FATAL: the database system is starting
        # up", so only messages of a postmaster that gave up count
        if not self.logfile.exists():
            return False
        log = self.logfile.read_text(errors="replace")
        return any(
            marker in log
            for marker in (
                "could not create any TCP/IP sockets",
                "could not bind",
                "database system is shut down",
            )
        )

    def stop(self) -> None:
        if not (self.datadir / "postmaster.pid").exists():
            return
        # immediate: nothing here is worth a clean shutdown checkpoint
        self._run("pg_ctl", "stop", "-m", "immediate", "-w", "-t", "30", f"--pgdata={self.datadir}")

    def log_tail(self, lines: int = 30) -> str:
        if not self.logfile.exists():
            return "(no server log)"
        return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])


def start_server(bindir: Path, attempts: int = 3) -> PostgresServer:
    require("postgres", "starts PostgreSQL")
    user = SERVICE_USER if os.geteuid() == 0 else None
    last: Exception | None = None
    for _ in range(attempts):  # a random port can be taken between picking and binding
        root = Path(tempfile.mkdtemp(prefix="gpuslice-pg-"))
        if user:
            pw = pwd.getpwnam(user)
            os.chown(root, pw.pw_uid, pw.pw_gid)
        root.chmod(0o700)
        server = PostgresServer(bindir=bindir, root=root, port=free_ports(1)[0], user=user)
        try:
            server.initdb()
            server.start()
            return server
        except Exception as exc:  # retried, then re-raised
            last = exc
            server.stop()
            shutil.rmtree(root, ignore_errors=True)
    raise RuntimeError(f"could not start PostgreSQL in {attempts} attempts") from last


@contextlib.contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """Create ``test_<random>`` on the server of ``server_url``; yield its URL; drop it."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    name = f"test_{uuid.uuid4().hex[:12]}"
    conninfo = f"host={url.host} port={url.port} user={url.username} dbname={url.database}"
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            # FORCE: a test that leaked a connection must not make teardown fail
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The two ledger databases a test runs on, for ``params=`` or ``parametrize``: the PostgreSQL
# case carries its marker (its fixture is asked for by name, which collection cannot see).
DATABASES = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = find_bindir()
    need(bindir is not None, "PostgreSQL (initdb)")
    assert bindir is not None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVICE_USER)
        except KeyError:
            need(False, f"PostgreSQL service user {SERVICE_USER!r} (server refuses root)")
    server = start_server(bindir)
    try:
        yield server
    finally:
        server.stop()
        shutil.rmtree(server.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """SQLAlchemy URL of the session's server (database ``postgres``)."""
    return postgres_server.url()


@pytest.fixture
def postgres_db(postgres_url: str) -> Iterator[str]:
    """SQLAlchemy URL of a database created for this test and dropped after it."""
    with fresh_database(postgres_url) as url:
        yield url
