"""Seed means and the readable table of ``python -m benchmarks.tracebench openb``."""

from __future__ import annotations

from collections.abc import Sequence
from statistics import fmean

from .simulate import SeedResult


def summarise(trace: str, policy: str, results: Sequence[SeedResult]) -> dict:
    ks = list(results[0].columns)
    allocated: dict[str, float | None] = {}
    for k in ks:
        values = [v for r in results if (v := r.columns[k]) is not None]
        allocated[k] = round(fmean(values), 2) if values else None
    keys = results[0].breakdown.keys()
    return {
        "trace": trace,
        "policy": policy,
        "seeds": [r.seed for r in results],
        "allocated_pct": allocated,
        "failed_pods": fmean(r.failed for r in results),
        "seconds_per_seed": round(fmean(r.seconds for r in results), 3),
        "pods_per_seed": fmean(r.pods for r in results),
        "time_breakdown_s": {k: round(fmean(r.breakdown[k] for r in results), 3) for k in keys},
        **{k: round(fmean(r.extra[k] for r in results), 2) for k in results[0].extra},
    }


def table(summary: dict, results: Sequence[SeedResult]) -> str:
    ks = list(summary["allocated_pct"])
    head = f"{'seed':>6} " + " ".join(f"{k + '%':>8}" for k in ks) + f" {'failed':>7} {'s':>6}"
    lines = [
        f"openb trace {summary['trace']!r}, policy {summary['policy']!r}: "
        "GPU allocation (% of capacity) at each arrival (% of capacity)",
        head,
    ]
    for r in results:
        cells = " ".join(f"{_fmt(r.columns[k]):>8}" for k in ks)
        lines.append(f"{r.seed:>6} {cells} {r.failed:>7} {r.seconds:>6.2f}")
    cells = " ".join(f"{_fmt(summary['allocated_pct'][k]):>8}" for k in ks)
    lines.append(
        f"{'mean':>6} {cells} {summary['failed_pods']:>7.1f} {summary['seconds_per_seed']:>6.2f}"
    )
    lines.append(
        "time per seed (s): "
        + ", ".join(f"{k} {v:g}" for k, v in summary["time_breakdown_s"].items())
    )
    return "\n".join(lines) + "\n"


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
