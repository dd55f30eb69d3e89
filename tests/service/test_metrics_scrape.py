"""/metrics counts idle events without rereading history on every scrape."""

from __future__ import annotations

from prometheus_client import generate_latest
from sqlalchemy import delete

from gpuslice_hub.db.models import EventRow
from gpuslice_hub.metrics import make_registry


def culls(text: str, scope: str) -> float:
    series = f'gpuslice_idle_culls_total{{profile="",scope="{scope}"}} '
    line = next((x for x in text.splitlines() if x.startswith(series)), series + "0")
    return float(line.rsplit(" ", 1)[1])


def test_each_scrape_reads_only_the_events_since_the_last(make_ledger):
    ledger = make_ledger()
    for _ in range(3):
        ledger.record_event("idle-culled", "ann", "service", "idle", {"scope": "server"})
    registry, _ = make_registry(ledger)
    assert culls(generate_latest(registry).decode(), "server") == 3

    # History already counted is not read again: deleting it (as retention deletes the
    # oldest events) changes nothing, and what was recorded since is added.
    newest = ledger.record_event("released", "ann", "ann", "not an idle event", {})
    with ledger.db.writing() as s:
        s.execute(delete(EventRow).where(EventRow.id < newest["id"]))
    ledger.record_event("idle-culled", "bob", "service", "idle", {"scope": "kernel"})
    text = generate_latest(registry).decode()
    assert culls(text, "server") == 3 and culls(text, "kernel") == 1
