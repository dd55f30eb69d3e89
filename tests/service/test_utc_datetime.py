"""The ledger's time type on SQLite (``UTCDateTime``) writes and reads timestamps through
its own two functions: they must give exactly what SQLAlchemy's composition of the type's
steps with SQLite's text format gives, for every instant and every text it reads back."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, create_engine, insert, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import DATETIME

from gpuslice_hub.db.models import UTCDateTime


def sqlalchemys_text(value: datetime | None) -> str | None:
    """What SQLAlchemy's own steps send: the type's ``process_bind_param``, then SQLite's
    DATETIME format."""
    dialect = sqlite.dialect()
    processed = UTCDateTime().process_bind_param(value, dialect)
    process = DATETIME().bind_processor(dialect)
    return None if processed is None else process(processed)


def sqlalchemys_instant(value: str | None) -> datetime | None:
    dialect = sqlite.dialect()
    process = DATETIME().result_processor(dialect, None)
    return UTCDateTime().process_result_value(process(value), dialect)


def instants() -> list[datetime | None]:
    rng = random.Random(11)
    zones = [UTC, timezone(timedelta(hours=-7)), timezone(timedelta(hours=5, minutes=30))]
    out: list[datetime | None] = [
        None,
        datetime(2026, 12, 5, tzinfo=UTC),  # no microseconds
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 30),  # naive: taken as UTC, as the type does
    ]
    for _ in range(300):
        at = datetime(2000, 1, 1, tzinfo=UTC) + timedelta(
            seconds=rng.uniform(0, 40 * 365 * 86400), microseconds=rng.randrange(1_000_000)
        )
        out.append(at.astimezone(rng.choice(zones)))
    return out


def test_the_sqlite_processors_give_what_sqlalchemys_steps_give():
    dialect = sqlite.dialect()
    to_text = UTCDateTime().dialect_impl(dialect).bind_processor(dialect)
    to_instant = UTCDateTime().dialect_impl(dialect).result_processor(dialect, None)
    assert to_text is not None and to_instant is not None
    for at in instants():
        sent = to_text(at)
        assert sent == sqlalchemys_text(at), at
        back = to_instant(sent)
        assert back == sqlalchemys_instant(sent), sent
        assert back is None or back.tzinfo is not None  # never naive above the type
    # texts written otherwise (by hand, or an older format without the fraction)
    for written in ["2030-01-01 00:00:00", "2030-01-01 00:00:00.5", "2026-12-05 10:11:12.000001"]:
        assert to_instant(written) == sqlalchemys_instant(written), written


def test_an_instant_goes_through_sqlite_and_comes_back_the_same(tmp_path: Path):
    engine = create_engine(f"sqlite:///{tmp_path}/t.sqlite")
    table = Table(
        "t", MetaData(), Column("id", Integer, primary_key=True), Column("at", UTCDateTime)
    )
    table.metadata.create_all(engine)
    values = instants()
    with engine.begin() as conn:
        conn.execute(insert(table), [{"id": i, "at": at} for i, at in enumerate(values)])
        stored = dict(conn.execute(text("SELECT id, at FROM t")).all())
        back = dict(conn.execute(select(table.c.id, table.c.at)).all())
    for i, at in enumerate(values):
        assert stored[i] == sqlalchemys_text(at)
        expected = None if at is None else (at if at.tzinfo else at.replace(tzinfo=UTC))
        assert back[i] == expected


def test_the_api_writes_every_time_in_utc_with_a_z():
    # (issue 48: one writer, gpuslice.isotime, for the service's datetimes and the
    # extension's and the runner's epoch seconds; there were three)
    from datetime import timedelta, timezone

    from gpuslice.isotime import iso

    naive = datetime(2026, 12, 7, 15, 4, 5, 250000)  # as the ledger stores it: UTC
    assert iso(naive) == "2026-12-07T15:04:05.250000Z"
    paris = naive.replace(tzinfo=UTC).astimezone(timezone(timedelta(hours=1)))
    assert iso(paris) == iso(naive)
    assert iso(naive.replace(tzinfo=UTC).timestamp()) == iso(naive)
    assert iso(None) is None
