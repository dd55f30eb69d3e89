"""``gpuslice-sim``: compare policies on one workload (``run``), or ask what-if of a site's
own history (``replay --from-ledger``)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .engine import Result, Settings, Simulation
from .interactive import ParameterError, generate, load_parameters
from .openb import batch_jobs
from .policies import POLICIES, PROFILE_MILLI, Policy
from .report import table, write
from .workload import Workload


def _policies(names: str, vary: list[str]) -> list[Policy]:
    out = []
    for name in names.split(","):
        if name not in POLICIES:
            raise SystemExit(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
        out.append(POLICIES[name])
    # policy 5: the last policy named, with one admin setting changed per value
    base = out[-1]
    for item in vary:
        key, _, values = item.partition("=")
        # a window's spans have commas of their own ("sat,sun 00:00-24:00"): "|" separates
        for raw in values.split("|" if key in ("batch_window", "reserved") else ","):
            value: Any = raw
            if key in ("idle_timeout", "warning_lead"):
                value = float(raw)
            elif key in ("defrag", "shares"):
                value = int(raw)
            elif key == "quotas":
                value = float(raw)
            elif key == "slices":
                value = raw.lower() in ("1", "true", "yes")
            try:
                out.append(base.vary(key, value))
            except ValueError as e:
                raise SystemExit(f"--vary {item}: {e}") from None
    return out


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(n_hosts=args.hosts, mig_hosts=args.mig_hosts)


def _generated(args: argparse.Namespace) -> Workload:
    try:
        params = load_parameters(args.interactive)
    except (ParameterError, OSError) as e:
        raise SystemExit(str(e)) from None
    if args.users is not None:
        params["population"]["users"] = args.users
    users, groups = params["population"]["users"], params["population"]["groups"]
    sessions = generate(params, args.days, args.seed, PROFILE_MILLI)
    jobs = batch_jobs(
        args.days,
        8 * args.hosts,
        args.batch_load,
        args.seed,
        args.batch_busy,
        args.checkpoint_interval,
        users,
        groups,
        trace=args.trace,
    )
    sources = [
        f"interactive: generator ({args.interactive or 'benchmarks/sim/interactive.toml'}), "
        f"{users} users, seed {args.seed}",
        f"batch: openb {args.trace} trace, offered {args.batch_load:g} x capacity, jobs keep "
        f"{args.batch_busy:.0%} of their request busy, checkpoint every "
        f"{args.checkpoint_interval:g} s",
    ]
    return Workload(args.days, sessions, jobs, sources)


def _simulate(workload: Workload, policy: Policy, settings: Settings, seed: int) -> Result:
    result = Simulation(workload, policy, settings, seed=seed).run()
    print(f"policy {policy.name}: {result.wall_seconds:.0f} s of simulation", file=sys.stderr)
    return result


def _simulate_all(
    workload: Workload, policies: list[Policy], settings: Settings, seed: int, jobs: int
) -> list[Result]:
    """Each policy's simulation, ``jobs`` at a time, each in a process of its own: a
    simulation is one thread's work (the service's code, start to end), and the policies
    share nothing but the workload."""
    workers = max(1, min(jobs, len(policies)))
    if workers == 1:
        return [_simulate(workload, policy, settings, seed) for policy in policies]
    # spawned, not forked: the caller may have threads (a forked lock held by one of them
    # would never be let go in the child)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        runs = [pool.submit(_simulate, workload, p, settings, seed) for p in policies]
        return [run.result() for run in runs]


def _run(workload: Workload, policies: list[Policy], args: argparse.Namespace) -> None:
    results = _simulate_all(workload, policies, _settings(args), args.seed, args.jobs)
    cluster = (
        f"{len(workload.hosts)} hosts of the site's inventory"
        if workload.hosts is not None
        else f"{args.hosts} hosts x 8 A100-80GB ({args.mig_hosts} in MIG mode where the "
        "policy offers slices)"
    )
    context = {
        "cluster": cluster,
        "days": workload.days,
        "sessions": len(workload.sessions),
        "batch jobs": len(workload.jobs),
        **{f"source {i + 1}": s for i, s in enumerate(workload.sources)},
    }
    if args.out:
        rows = write(results, Path(args.out), context)
    else:
        from .measure import summary

        rows = [summary(r) for r in results]
    print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=1))


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hosts", type=int, default=25, help="hosts of 8 A100s (default 25: 200 GPUs)")
    p.add_argument("--mig-hosts", type=int, default=2, help="of them in MIG mode (default 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policies", default="1,2,3,4", help="policies to compare (default 1,2,3,4)")
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="policy 5: the last policy with one setting changed (idle_timeout, "
        "warning_lead, placement, slices, batch_window, reserved, defrag, overcommit), once per "
        "value (and burst); may be "
        "repeated; batch_window and reserved values are separated by '|', a window's spans "
        "by ';' (UTC); reserved is N (the first N hosts reserved for interactive sessions) "
        "or N@spans (preemptible jobs borrow them in those spans); overcommit is RATIO or "
        "RATIO@HOURS (share_overcommit_ratio and share_overcommit_min_hours); burst is AFTER "
        "or AFTER@ALLOCATED (burst_after_wait, burst_when_allocated_above; every batch job "
        "burstable, to capacity bought without limit); quotas is DAY (on that day every "
        "suggested quota is applied, from the days before); shares is STEP (batch jobs "
        "asking less than a GPU get the smallest share of a menu in steps of STEP milli-GPU)",
    )
    p.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        help="policies simulated at once, each in a process of its own (default: the "
        "machine's CPUs)",
    )
    p.add_argument("--out", help="folder for report.md, summary.json and the plots")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpuslice-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compare policies on a generated + openb workload")
    _common(run)
    run.add_argument("--days", type=float, default=30.0)
    run.add_argument("--interactive", type=Path, help="interactive parameters (TOML)")
    run.add_argument("--users", type=int, help="override the population's users")
    run.add_argument(
        "--trace",
        default="default",
        help="openb trace (default, gpushare40, ...) or a CSV file in its format",
    )
    run.add_argument("--batch-load", type=float, default=0.6, help="batch work offered, x capacity")
    run.add_argument("--batch-busy", type=float, default=0.8, help="share of a job's GPU busy")
    run.add_argument("--checkpoint-interval", type=float, default=600.0)
    run.add_argument("--workload", type=Path, help="replay this saved workload instead")
    run.add_argument("--save-workload", type=Path, help="save the workload (JSON)")
    replay = sub.add_parser(
        "replay", help="what-if on a site's own history: its ledger's last days, each policy"
    )
    _common(replay)
    _history(replay)
    export = sub.add_parser("export", help="save a site's history as a workload (JSON)")
    _history(export)
    export.add_argument("--seed", type=int, default=1)
    export.add_argument("--to", type=Path, required=True, help="the workload file to write")
    args = parser.parse_args(argv)
    if args.command == "run":
        workload = Workload.load(args.workload) if args.workload else _generated(args)
        if args.save_workload:
            workload.save(args.save_workload)
        _run(workload, _policies(args.policies, args.vary), args)
    elif args.command == "replay":
        _run(_exported(args), _policies(args.policies, args.vary), args)
    else:
        workload = _exported(args)
        workload.save(args.to)
        print(f"{args.to}: {len(workload.sessions)} sessions, {len(workload.jobs)} jobs")


def _history(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-ledger",
        required=True,
        metavar="DB_URL",
        help="the service's database (GPUSliceService.db_url), read only",
    )
    p.add_argument("--days", type=float, default=30.0, help="the last days of it (default 30)")
    p.add_argument(
        "--interactive",
        type=Path,
        help="interactive parameters (TOML): use and idleness inside the sessions",
    )
    p.add_argument("--batch-busy", type=float, default=0.8, help="share of a job's GPU busy")


def _exported(args: argparse.Namespace) -> Workload:
    from sqlalchemy.exc import SQLAlchemyError

    from .replay import export

    try:
        params = load_parameters(args.interactive)
        return export(args.from_ledger, args.days, params, args.seed, args.batch_busy)
    except (ParameterError, OSError, SQLAlchemyError) as e:
        raise SystemExit(f"cannot read the history: {e}") from None
