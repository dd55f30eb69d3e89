"""One service per ledger (db/owner.py): a second process cannot hold a ledger that one
holds, gets it once the first lets go, and the service's start says why it refuses."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from sqlalchemy import text

from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.owner import LedgerInUse, hold_ledger
from gpuslice_hub.db.schema import safe_url

# Another process asks for the ledger and reports what it got.
OTHER = textwrap.dedent(
    """
    import sys
    from gpuslice_hub.db.engine import open_database
    from gpuslice_hub.db.owner import LedgerInUse, hold_ledger
    db = open_database(sys.argv[1])
    try:
        let_go = hold_ledger(db, "the ledger", wait=float(sys.argv[2]))
    except LedgerInUse as e:
        print("refused:", e)
    else:
        print("held")
        let_go()
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
    let_go = hold_ledger(db, safe_url(db_url), wait=0)
    try:
        answer = other_process(db_url, 0.5)
        assert answer.startswith("refused: another gpuslice service")
        assert "Run one service per ledger" in answer
        if db_url.startswith("sqlite"):
            assert f"process {os.getpid()}" in answer  # who holds it
    finally:
        let_go()
    assert other_process(db_url, 0) == "held"  # let go: the next one gets it at once
    db.dispose()


def test_the_same_process_cannot_hold_one_ledger_twice_either(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    db = open_database(url)
    let_go = hold_ledger(db, url, wait=0)
    with pytest.raises(LedgerInUse):
        hold_ledger(open_database(url), url, wait=0)
    let_go()
    hold_ledger(open_database(url), url, wait=0)()


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
    let_go = hold_ledger(db, url, wait=0)
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
        let_go()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gpuslice: another gpuslice service" in done.stderr
    assert "upgrade" not in done.stderr  # refused before the schema was looked at


def test_upgrade_db_refuses_at_once_under_a_running_service(tmp_path):
    url = f"sqlite:///{tmp_path}/ledger.sqlite"
    config = service_config(tmp_path, url)
    db = open_database(url)
    let_go = hold_ledger(db, url, wait=0)  # as the running service holds it
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuslice_hub.app", "upgrade-db", "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        let_go()
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gpuslice: another gpuslice service" in done.stderr
    with db.reading() as s:  # nothing was migrated
        assert not s.execute(text("SELECT name FROM sqlite_master")).all()
    db.dispose()
