"""``gpuslice-sim``: compare policies on one workload (``run``), or ask what-if of a site's
own history (``replay --from-ledger``)."""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from .engine import Result, Settings, Simulation, check
from .interactive import ParameterError, generate, load_parameters
from .openb import batch_jobs, read_tasks, trace_path
from .policies import POLICIES, PROFILE_MILLI, VARIABLE, Policy
from .report import table, write
from .workload import Workload, WorkloadError


# --vary: each key's values, as text -> the policy's setting (ValueError: what it must be)
def _seconds(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value > 0):
        raise ValueError
    return value


def _whole(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError
    return value


def _day(raw: str) -> float:
    value = float(raw)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError
    return value


def _boolean(raw: str) -> bool:
    word = raw.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("0", "false", "no", "off"):
        return False
    raise ValueError


VALUES: dict[str, tuple[Any, str]] = {
    "idle_timeout": (_seconds, "seconds, a number above 0"),
    "warning_lead": (_seconds, "seconds, a number above 0"),
    "defrag": (_whole, "jobs moved per hour, a whole number, 0 or more"),
    "shares": (_whole, "a step in milli-GPU, a whole number"),
    "quotas": (_day, "a day of the run, a number, 0 or more"),
    "slices": (_boolean, "true or false"),
}
# what a setting changes, and the policies where it changes nothing (a setting that does
# nothing is refused)
NEEDS: dict[str, tuple[Any, str]] = {
    "idle_timeout": (lambda p: p.reclaim != "none", "reclaims nothing"),
    "warning_lead": (lambda p: p.reclaim == "gpu", "gives no warning before a cull"),
    "defrag": (lambda p: p.batch == "preemptible", "submits no preemptible job to move"),
    "overcommit": (lambda p: p.slices, "hands out no shares"),
    "shares": (lambda p: p.slices, "hands out no shares"),
}


def _policies(names: str, vary: list[str]) -> list[tuple[Policy, str]]:
    """The policies named, then policy 5's variants: each with what the CLI calls it
    (for its errors)."""
    out: list[tuple[Policy, str]] = []
    for name in names.split(","):
        if name not in POLICIES:
            raise SystemExit(f"unknown policy {name!r}; known: {', '.join(POLICIES)}")
        out.append((POLICIES[name], f"policy {name}"))
    # policy 5: the last policy named, with one admin setting changed per value
    base = out[-1][0]
    for item in vary:
        key, eq, values = item.partition("=")
        if not eq:
            raise SystemExit(f"--vary {item}: write it as KEY=V1,V2")
        if key not in VARIABLE:
            raise SystemExit(f"--vary {item}: cannot vary {key!r}: one of {', '.join(VARIABLE)}")
        needs = NEEDS.get(key)
        if needs is not None and not needs[0](base):
            raise SystemExit(
                f"--vary {item}: policy {base.name} {needs[1]}: {key} would change nothing"
            )
        # a window's spans have commas of their own ("sat,sun 00:00-24:00"): "|" separates
        for raw in values.split("|" if key in ("batch_window", "reserved") else ","):
            if not raw.strip():
                raise SystemExit(f"--vary {item}: an empty value")
            value: Any = raw
            if key in VALUES:
                parse, said = VALUES[key]
                try:
                    value = parse(raw)
                except ValueError:
                    raise SystemExit(f"--vary {item}: {key} must be {said}, got {raw!r}") from None
            try:
                out.append((base.vary(key, value), f"--vary {item}"))
            except ValueError as e:
                raise SystemExit(f"--vary {item}: {e}") from None
    return out


def _checked(
    policies: list[tuple[Policy, str]], workload: Workload, settings: Settings
) -> list[Policy]:
    """Every policy's configuration built on ``workload``'s cluster, as its simulation
    would build it, before any simulation starts: a setting the service would refuse, or
    one that changes nothing on this workload, stops the run here."""
    for policy, said in policies:
        try:
            check(workload, policy, settings)
        except ValueError as e:
            raise SystemExit(f"{said}: {e}") from None
        changed = dict(policy.changed)
        if changed.get("quotas", 0) >= workload.days:
            raise SystemExit(
                f"{said}: the run is {workload.days:g} days long: quotas on day "
                f"{changed['quotas']:g} would never be applied"
            )
        if (
            "shares" in changed
            and workload.jobs
            and not any(j.request_milli for j in workload.jobs)
        ):
            raise SystemExit(
                f"{said}: shares changes nothing on this workload: its batch jobs do not say "
                "what they need below their profile (a site's history does not)"
            )
    return [policy for policy, _ in policies]


def _settings(args: argparse.Namespace) -> Settings:
    return Settings(n_hosts=getattr(args, "hosts", 25), mig_hosts=getattr(args, "mig_hosts", 2))


def _generated(args: argparse.Namespace) -> Workload:
    try:
        params = load_parameters(args.interactive)
    except ParameterError as e:
        raise SystemExit(str(e)) from None
    if args.users is not None:
        params["population"]["users"] = args.users
    users, groups = params["population"]["users"], params["population"]["groups"]
    try:
        sessions = generate(params, args.days, args.seed, PROFILE_MILLI)
    except ParameterError as e:
        raise SystemExit(f"{args.interactive or 'interactive parameters'}: {e}") from None
    try:
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
    except (OSError, ValueError) as e:
        raise SystemExit(f"--trace {args.trace}: {e}") from None
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
    cluster = (
        f"{len(workload.hosts)} host{'s' if len(workload.hosts) != 1 else ''} of the site's "
        "inventory"
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
    # what the workload is, and what it leaves out, before the figures
    print("".join(f"- {k}: {v}\n" for k, v in context.items()))
    results = _simulate_all(workload, policies, _settings(args), args.seed, args.jobs)
    if args.out:
        rows = write(results, Path(args.out), context)
    else:
        from .measure import summary

        rows = [summary(r) for r in results]
    print(table(rows))
    if args.json:
        print(json.dumps(rows, indent=1))


def _common(p: argparse.ArgumentParser, cluster: bool = True) -> None:
    if cluster:
        p.add_argument("--hosts", type=_positive, help="hosts of 8 A100s (default 25: 200 GPUs)")
        p.add_argument("--mig-hosts", type=_count, help="of them in MIG mode (default 2)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--policies", default="1,2,3,4", help="policies to compare (default 1,2,3,4)")
    p.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2",
        help="policy 5: the last policy with one setting changed (one of "
        + ", ".join(VARIABLE)
        + "), once per value; may be "
        "repeated; batch_window and reserved values are separated by '|', a window's spans "
        "by ';' (UTC); reserved is N (the first N hosts reserved for interactive sessions) "
        "or N@spans (preemptible jobs borrow them in those spans); overcommit is RATIO or "
        "RATIO@HOURS (share_overcommit_ratio and share_overcommit_min_hours); burst is AFTER "
        "or AFTER@ALLOCATED (burst_after_wait, burst_when_allocated_above; every batch job "
        "burstable, to capacity bought without limit); quotas is DAY (on that day every "
        "suggested quota is applied, from the days before); shares is STEP (batch jobs "
        "asking less than a GPU get the smallest share of a menu in steps of STEP milli-GPU); "
        "slices is true or false",
    )
    p.add_argument(
        "--jobs",
        type=_positive,
        default=os.cpu_count() or 1,
        help="policies simulated at once, each in a process of its own (default: the "
        "machine's CPUs)",
    )
    p.add_argument("--out", type=Path, help="folder for report.md, summary.json and the plots")
    p.add_argument("--json", action="store_true", help="print the figures as JSON too")


def _number(text: str, kind: Any = float) -> Any:
    try:
        value = kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _positive(text: str) -> int:
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return int(value)


def _count(text: str) -> int:
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return int(value)


def _above_0(text: str) -> float:
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return float(value)


def _at_least_0(text: str) -> float:
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return float(value)


def _share(text: str) -> float:
    value = _number(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be a share above 0 and at most 1, got {text}")
    return float(value)


# run's options that make a workload, with their defaults: none applies to a saved one
GENERATOR = {
    "days": 30.0,
    "interactive": None,
    "users": None,
    "trace": "default",
    "batch_load": 0.6,
    "batch_busy": 0.8,
    "checkpoint_interval": 600.0,
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="gpuslice-sim", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="compare policies on a generated + openb workload")
    _common(run)
    run.add_argument("--days", type=_above_0, help="days to simulate (default 30)")
    run.add_argument("--interactive", type=Path, help="interactive parameters (TOML)")
    run.add_argument("--users", type=_positive, help="override the population's users")
    run.add_argument(
        "--trace",
        help="openb trace (default, gpushare40, ...) or a CSV file in its format",
    )
    run.add_argument(
        "--batch-load", type=_at_least_0, help="batch work offered, x capacity (default 0.6)"
    )
    run.add_argument("--batch-busy", type=_share, help="share of a job's GPU busy (default 0.8)")
    run.add_argument(
        "--checkpoint-interval", type=_above_0, help="seconds between checkpoints (default 600)"
    )
    run.add_argument(
        "--workload",
        type=Path,
        help="replay this saved workload instead (it brings its own days, sessions and jobs)",
    )
    run.add_argument("--save-workload", type=Path, help="save the workload (JSON)")
    replay = sub.add_parser(
        "replay", help="what-if on a site's own history: its ledger's last days, each policy"
    )
    _common(replay, cluster=False)
    # (its cluster is the site's inventory: refused, with a word why)
    replay.add_argument("--hosts", help=argparse.SUPPRESS)
    replay.add_argument("--mig-hosts", help=argparse.SUPPRESS)
    _history(replay)
    export = sub.add_parser("export", help="save a site's history as a workload (JSON)")
    _history(export)
    export.add_argument("--seed", type=int, default=1)
    export.add_argument("--to", type=Path, required=True, help="the workload file to write")
    args = parser.parse_args(argv)
    for key in ("out", "save_workload", "to"):
        _writable(key, getattr(args, key, None))
    if args.command == "run":
        workload = _workload(args)
        policies = _checked(_policies(args.policies, args.vary), workload, _settings(args))
        if args.save_workload:
            workload.save(args.save_workload)
        _run(workload, policies, args)
    elif args.command == "replay":
        if args.hosts is not None or args.mig_hosts is not None:
            raise SystemExit(
                "replay: --hosts and --mig-hosts do not apply: a replay runs on the site's own "
                "inventory, as its ledger records it"
            )
        named = _policies(args.policies, args.vary)
        workload = _exported(args)
        _run(workload, _checked(named, workload, _settings(args)), args)
    else:
        workload = _exported(args)
        workload.save(args.to)
        print(f"{args.to}: {len(workload.sessions)} sessions, {len(workload.jobs)} jobs")
        for line in workload.sources:
            print(f"- {line}")


def _workload(args: argparse.Namespace) -> Workload:
    """run's workload: the saved one (none of the generator's options given), or one
    generated; every option and every policy checked before it is generated."""
    if args.workload:
        given = [k for k in GENERATOR if getattr(args, k) is not None]
        if given:
            said = ", ".join("--" + k.replace("_", "-") for k in given)
            raise SystemExit(
                f"--workload: {said} cannot apply to a saved workload (it has its own days, "
                "sessions and jobs); leave them out"
            )
        try:
            workload = Workload.load(args.workload)
        except WorkloadError as e:
            raise SystemExit(f"--workload {e}") from None
        if workload.hosts is not None and (args.hosts is not None or args.mig_hosts is not None):
            raise SystemExit(
                f"--workload: {args.workload} brings its own cluster (a site's inventory, "
                f"{len(workload.hosts)} hosts): --hosts and --mig-hosts do not apply"
            )
        _cluster_defaults(args)
        return workload
    for key, default in GENERATOR.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    _cluster_defaults(args)
    if not trace_path(args.trace).is_file():
        try:
            read_tasks(args.trace)  # (says which traces there are)
        except (OSError, ValueError) as e:
            raise SystemExit(f"--trace {args.trace}: {e}") from None
    # the policies' settings, on the cluster the workload will run on, before generating it
    _checked(_policies(args.policies, args.vary), Workload(args.days), _settings(args))
    return _generated(args)


def _cluster_defaults(args: argparse.Namespace) -> None:
    args.hosts = 25 if args.hosts is None else args.hosts
    args.mig_hosts = min(2, args.hosts) if args.mig_hosts is None else args.mig_hosts
    if args.mig_hosts > args.hosts:
        raise SystemExit(
            f"--mig-hosts: {args.mig_hosts} hosts in MIG mode, but --hosts is {args.hosts}"
        )


def _writable(key: str, path: Path | None) -> None:
    """A file or folder the command will write: refused now if it cannot be, not after
    the simulations."""
    if path is None:
        return
    option = "--" + key.replace("_", "-")
    if key == "out":
        if path.exists() and not path.is_dir():
            raise SystemExit(f"{option} {path}: not a folder")
    elif path.is_dir():
        raise SystemExit(f"{option} {path}: a folder, not a file")
    parent = path if key == "out" else path.parent
    if key == "out":  # (made with the folders above it)
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
    elif not parent.is_dir():
        raise SystemExit(f"{option} {path}: no such folder: {parent}")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise SystemExit(f"{option} {path}: cannot write under {parent}")


def _history(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--from-ledger",
        required=True,
        metavar="DB_URL",
        help="the service's database (GPUSliceService.db_url), read only: "
        "postgresql://user@host/db, or sqlite:////abs/path/gpuslice.sqlite",
    )
    p.add_argument("--days", type=_above_0, default=30.0, help="the last days of it (default 30)")
    p.add_argument(
        "--interactive",
        type=Path,
        help="interactive parameters (TOML): use and idleness inside the sessions",
    )
    p.add_argument(
        "--batch-busy", type=_share, default=0.8, help="share of a job's GPU busy (default 0.8)"
    )


def _exported(args: argparse.Namespace) -> Workload:
    from sqlalchemy.exc import SQLAlchemyError

    from .replay import HistoryError, export

    try:
        params = load_parameters(args.interactive)
    except ParameterError as e:
        raise SystemExit(str(e)) from None
    try:
        return export(args.from_ledger, args.days, params, args.seed, args.batch_busy)
    except HistoryError as e:
        raise SystemExit(f"cannot read the history: {e}") from None
    except SQLAlchemyError as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(f"cannot read the history: {first}") from None
