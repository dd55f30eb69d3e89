"""The report of a comparison: a table (Markdown), the figures (JSON) and plots (SVG)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .engine import Result
from .measure import summary
from .svg import line_chart

COLUMNS = (
    ("policy", "policy", "{}"),
    ("allocation_rate", "allocated", "{:.1%}"),
    ("effective_utilization", "effective util.", "{:.1%}"),
    ("share_of_bound", "of the bound", "{:.0%}"),
    ("wait_p50", "wait p50 (s)", "{:.0f}"),
    ("wait_p95", "wait p95 (s)", "{:.0f}"),
    ("refused_share", "refused", "{:.1%}"),
    ("gave_up", "gave up", "{}"),
    ("queue_p50_h", "batch queue p50 (h)", "{:.2f}"),
    ("completion_p50_h", "batch completion p50 (h)", "{:.2f}"),
    ("jobs_completed", "jobs done", "{}"),
    ("preemptions_per_job", "preemptions/job", "{:.2f}"),
    ("lost_per_stop_max_s", "lost/preemption max (s)", "{:.0f}"),
    ("batch_lost_gpu_hours", "batch lost (GPU-h)", "{:.1f}"),
    ("interactive_lost_gpu_hours", "session work lost (GPU-h)", "{:.1f}"),
    ("reclaimed_gpu_hours", "reclaimed (GPU-h)", "{:.0f}"),
    ("fragmented_share", "fragmented", "{:.1%}"),
    ("jobs_moved", "jobs moved (defrag)", "{}"),
    ("overcommitted_grants", "shares overcommitted", "{}"),
    ("memory_collisions", "memory collisions", "{}"),
    ("jobs_burst", "jobs burst", "{}"),
    ("burst_gpu_hours", "burst (GPU-h bought)", "{:.0f}"),
    ("quotas_applied", "quotas applied", "{}"),
    ("quota_refusals", "refused over quota", "{}"),
    ("jobs_not_started", "never started (by GPUs)", "{}"),
    ("capacity_check", "capacity check says", "{}"),
)


# The capacity check's verdicts (gpuslice_hub/admin/capacity_check.py), as its codes in
# the "capacity check says" column, in words (docs/simulator.md defines each)
CAPACITY_WORDS = {
    "no-data": "no usage samples at all: the check cannot say anything",
    "history": "too little history (under 80 % of 7 and of 30 days) to say whether owning "
    "or renting the GPUs pays",
    "own": "allocated steadily above 60 % (7 and 30 days): owning the hardware pays",
    "rent": "allocated steadily below 40 % (7 and 30 days): renting by the hour would cost less",
    "between": "allocated neither steadily above 60 % nor below 40 %: neither owning nor "
    "renting clearly pays",
    "no-queue": "no lasting batch queue in the last 7 days: jobs waited less than a tenth "
    "of their run time (medians)",
    "use-unknown": "jobs queued, but usage reports covered too little to tell why",
    "scheduling": "jobs queued while the slices held were less than half busy: a scheduling "
    "problem (reclaim, smaller slices, backfill gain more than hardware)",
    "capacity": "jobs queued with the pool at least 80 % allocated and busy: a capacity "
    "problem (short of hardware)",
    "fit": "jobs queued while less than 80 % of the pool was allocated: what was free did "
    "not fit what waited (quotas, fragmentation or profiles), a scheduling problem",
    "burst": "jobs waited more than half as long as they ran (medians, 7 days): bursting to "
    "a second partition would shorten the queue",
}


def table(rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" if k == "policy" else "---:" for k, _, _ in COLUMNS) + "|"
    lines = [head, rule]
    for row in rows:
        never = row.get("jobs_not_started_by_gpus") or {}
        row = {**row, "jobs_not_started": " ".join(f"{n}x{g}" for g, n in never.items()) or "0"}
        cells = ["-" if row.get(k) is None else fmt.format(row[k]) for k, _, fmt in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    legend = "\n".join(f"- **{r['policy']}**: {r['title']}" for r in rows)
    said = sorted({c for r in rows for c in str(r.get("capacity_check") or "").split()})
    words = "".join(f"- `{c}`: {CAPACITY_WORDS.get(c, 'see the admin guide')}\n" for c in said)
    if words:
        words = "\ncapacity check says:\n\n" + words
    bounds = sorted({f"{r['demand_bound']:.1%}" for r in rows if r.get("demand_bound")})
    bound = (
        f"\nThe workload's demand bound (the busy GPU work it offers inside the horizon, "
        f"over capacity: no scheduler does more): {', '.join(bounds)}. *of the bound*: "
        "effective utilization over it. *never started*: jobs submitted two days or more "
        "before the end that never started, as count x GPUs asked.\n"
        if bounds
        else ""
    )
    return "\n".join(lines) + "\n\n" + legend + "\n" + bound + words


def write(results: list[Result], out: Path, context: dict[str, Any]) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    rows = [summary(r) for r in results]
    (out / "summary.json").write_text(json.dumps({"context": context, "policies": rows}, indent=1))
    (out / "report.md").write_text(
        "# gpuslice-sim\n\n"
        + "".join(f"- {k}: {v}\n" for k, v in context.items())
        + "\n"
        + table(rows)
    )
    day = 86400.0

    def series(key: str) -> dict[str, list[tuple[float, float]]]:
        return {
            r.policy.name: [(s["t"] / day, s[key] / r.capacity_milli) for s in r.samples]
            for r in results
        }

    (out / "utilization.svg").write_text(
        line_chart("GPU work done (busy GPUs / capacity)", series("busy"), "day", "share", 1.0)
    )
    (out / "allocation.svg").write_text(
        line_chart("Allocated (GPUs held / capacity)", series("allocated"), "day", "share", 1.0)
    )
    queued = {
        r.policy.name: [(s["t"] / day, float(s["queued_jobs"])) for s in r.samples] for r in results
    }
    (out / "queue.svg").write_text(line_chart("Batch jobs waiting", queued, "day", "jobs"))
    return rows
