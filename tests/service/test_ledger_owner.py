"""One service per ledger (db/owner.py): a second process cannot hold a ledger that one
holds, gets it once the first lets go, and the service's start says why it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import make_url, text

from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.owner import ADVISORY_KEY, LedgerInUse, hold_ledger
from gpuslice_hub.db.schema import safe_url
from tests.harness.ports import free_ports

# Another process asks for the ledger and reports what it got.
OTHER = textwrap.dedent(
    """
    import sys
    from gpuslice_hub.db.engine import open_database
    from gpuslice_hub.db.owner import LedgerInUse, hold_ledger
    db = open_database(sys.argv[1])
    try:
        hold = hold_ledger(db, "the ledger", wait=float(sys.argv[2]))
    except LedgerInUse as e:
        print("refused:", e)
    else:
        print("held")
        hold.let_go()
    db.dispose()
    """
)


def other_process(url: str, wait: float) -> str:
    out = subprocess.run(
        [sys.executable, "-c", OTHER, url, str(wait)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return out.stdout.strip()


def test_a_second_process_waits_for_the_ledger_then_is_refused(db_url):
    db = open_database(db_url)
    held = hold_ledger(db, safe_url(db_url), wait=0)
    try:
        answer = other_process(db_url, 0.5)
        assert answer.startswith("refused: another gpuslice service")
        assert "Run one service per ledger" in answer
        if db_url.startswith("sqlite"):
            assert f"process {os.getpid()}" in answer  # who holds it
    finally:
        held.let_go()
    assert other_process(db_url, 0) == "held"  # let go: the next one gets it at once
    db.dispose()


def test_the_same_process_cannot_hold_one_ledger_twice_either(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    db = open_database(url)
    held = hold_ledger(db, url, wait=0)
    with pytest.raises(LedgerInUse):
        hold_ledger(open_database(url), url, wait=0)
    held.let_go()
    hold_ledger(open_database(url), url, wait=0).let_go()


def service_config(tmp_path: Path, url: str) -> Path:
    config = tmp_path / "gpuslice_config.py"
    config.write_text(
        f"c.GPUSliceService.db_url = {url!r}\n"
        "c.GPUSliceService.gpu_backend = 'simulated'\n"
        "c.GPUSliceService.hosts = [{'name': 'h', 'cpu_milli': 1000, 'memory_mib': 1000,"
        " 'gpus': [{'model': 'NVIDIA A100-SXM4-80GB', 'memory_mib': 81920}]}]\n"
        "c.GPUSliceService.profiles = [{'name': 'gpu-1', 'kind': 'gpu', 'count': 1}]\n"
    )
    return config


def test_the_service_refuses_to_start_on_a_ledger_another_service_holds(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    config = service_config(tmp_path, url)
    db = open_database(url)
    held = hold_ledger(db, url, wait=0)
    start = textwrap.dedent(
        """
        import sys
        import gpuslice_hub.db.owner as owner
        owner.WAIT_SECONDS = 0.5  # (a real start waits 20 s for a service being replaced)
        from gpuslice_hub.app import main
        main(["--config", sys.argv[1]])
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", start, str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "JUPYTERHUB_API_TOKEN": "unused", "JUPYTERHUB_SERVICE_NAME": "x"},
        )
    finally:
        held.let_go()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gpuslice: another gpuslice service" in done.stderr
    assert "upgrade" not in done.stderr  # refused before the schema was looked at


def test_upgrade_db_refuses_at_once_under_a_running_service(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    config = service_config(tmp_path, url)
    db = open_database(url)
    held = hold_ledger(db, url, wait=0)  # as the running service holds it
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuslice_hub.app", "upgrade-db", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        held.let_go()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gpuslice: another gpuslice service" in done.stderr
    # what to do about it is to stop that service, not to give this one another ledger
    assert "stop it before upgrading its database" in done.stderr, done.stderr
    assert "a ledger of its own" not in done.stderr
    with db.reading() as s:  # nothing was migrated
        assert not s.execute(text("SELECT name FROM sqlite_master")).all()
    db.dispose()


# -- a hold lost while the service runs (LedgerHold.check) -------------------------------


def take_away(db_url: str) -> None:
    """End this process's hold the way it is lost in the field: the lock file removed (an
    admin's cleanup), or the hold's PostgreSQL session ended (a dropped connection)."""
    if db_url.startswith("sqlite"):
        os.remove(make_url(db_url).database + ".service-lock")
        return
    hi, lo = divmod(ADVISORY_KEY, 1 << 32)
    other = open_database(db_url)
    with other.write_engine.connect() as conn:
        pids = conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                " AND classid = :hi AND objid = :lo"
            ),
            {"hi": hi, "lo": lo},
        ).scalars()
        pids = list(pids)
        assert len(pids) == 1
        assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pids[0]}).scalar()
        conn.commit()
    other.dispose()


def test_a_hold_that_was_lost_and_is_free_is_taken_again(db_url):
    db = open_database(db_url)
    hold = hold_ledger(db, safe_url(db_url), wait=0)
    try:
        assert hold.check() is None  # held all along: nothing to say
        take_away(db_url)
        assert other_process(db_url, 0) == "held"  # lost: a second service could start
        what = hold.check()
        assert what is not None and "again" in what
        answer = other_process(db_url, 0)  # held again: it cannot any more
        assert answer.startswith("refused: another gpuslice service")
        if db_url.startswith("sqlite"):
            assert f"process {os.getpid()}" in answer
        assert hold.check() is None
    finally:
        hold.let_go()
    assert hold.check() is None  # let go of: never taken again by a late check
    assert other_process(db_url, 0) == "held"
    db.dispose()


def test_a_hold_another_service_took_meanwhile_cannot_be_checked_back(db_url):
    db = open_database(db_url)
    hold = hold_ledger(db, safe_url(db_url), wait=0)
    second_db = open_database(db_url)
    try:
        take_away(db_url)
        second = hold_ledger(second_db, safe_url(db_url), wait=0)
        with pytest.raises(LedgerInUse, match="another gpuslice service"):
            hold.check()
        second.let_go()
    finally:
        hold.let_go()
        second_db.dispose()
    db.dispose()


def test_a_service_that_lost_its_ledger_to_another_stops_and_says_why(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    config = service_config(tmp_path, url)
    with config.open("a") as f:  # (jobs as the service's account: this test runs no job)
        f.write(f"c.GPUSliceService.jobs_root = {str(tmp_path / 'jobs')!r}\n")
        f.write("c.JobManager.run_jobs_as_service_user = True\n")
    start = textwrap.dedent(
        """
        import sys
        import gpuslice_hub.db.owner as owner
        owner.CHECK_SECONDS = 0.2  # (a real service checks every 5 s)
        from gpuslice_hub.app import main
        main(["--config", sys.argv[1]])
        """
    )
    port = free_ports(1)[0]
    env = {
        **os.environ,
        "JUPYTERHUB_API_TOKEN": "unused",
        "JUPYTERHUB_SERVICE_NAME": "x",
        "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
    }
    service = subprocess.Popen(
        [sys.executable, "-c", start, str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        lock = Path(f"{tmp_path}/ledger.sqlite.service-lock")
        deadline = time.monotonic() + 60
        while not (lock.exists() and lock.read_text() == str(service.pid)):
            assert service.poll() is None, service.stderr.read()[-2000:]  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the service never held its ledger"
            time.sleep(0.05)  # (polling another process's start, with a deadline)
        take_away(url)
        db = open_database(url)
        second = hold_ledger(db, url, wait=0)  # another service, started meanwhile
        try:
            _, err = service.communicate(timeout=60)
        finally:
            second.let_go()
            db.dispose()
    finally:
        if service.poll() is None:
            service.kill()
            service.wait()
    assert service.returncode == 1, err[-2000:]
    assert "lost its hold on the ledger, and is stopping" in err
    assert "gpuslice: another gpuslice service" in err
