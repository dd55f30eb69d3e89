"""What Slurm's running jobs hold, per node and gres, from one ``squeue --json`` per pass.

On a Slurm cluster gpuslice shares the GPUs with jobs that never come through it (a
colleague's ``sbatch``). The ledger must not offer what they hold: the service reads what
every running job holds (``gres_detail``, per node), and the ledger keeps the part that its
own slices do not explain as *external* holdings (``ledger/external.py``).

Names are Slurm's gres as ``--gres`` writes them, without the count: ``gpu:1g.10gb`` (a MIG
instance), ``gpu:a100`` or ``gpu`` (whole GPUs), ``shard``/``mps`` (a GPU's shares, whose
type is dropped: a share grant asks for them untyped).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from collections.abc import Collection, Mapping
from typing import Any

from gpuslice.errors import GPUSliceError

# Job states in which a job holds its allocation. COMPLETING is left out: the job is ending
# and Slurm frees its gres within seconds; a slice offered meanwhile waits that long in
# Slurm's queue, where counting it would refuse a spawn right after a server stopped.
HOLDING_STATES = {
    "RUNNING",
    "CONFIGURING",
    "SUSPENDED",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
}
SHARE_GRES = ("shard", "mps")
# "gpu:1g.10gb:1(IDX:2)", "gpu:a100:2(IDX:0-1)", "shard:3(IDX:0)", "gpu:1(IDX:0)"
_GRES_ITEM = re.compile(r"(?P<name>[A-Za-z0-9_.+-]+)(?::(?P<type>[A-Za-z0-9_.+-]+))?:(?P<n>\d+)")
_HOST_RANGE = re.compile(r"^(?P<lo>\d+)(?:-(?P<hi>\d+))?$")
COMMAND_ENV_KEEP = ("PATH", "SLURM_CONF", "LANG", "LC_ALL", "TZ")


class SlurmReadError(GPUSliceError, RuntimeError):
    """Slurm could not be read: nothing may be concluded (and nothing released)."""


def expand_hostlist(expr: str) -> list[str]:
    """Slurm's hostlist expression as names: ``gpu[01-03,07],login`` ->
    ``["gpu01", "gpu02", "gpu03", "gpu07", "login"]`` (zero padding kept)."""
    names: list[str] = []
    depth = 0
    part = ""
    parts = []
    for ch in expr.strip():
        if ch == "," and depth == 0:
            parts.append(part)
            part = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        part += ch
    parts.append(part)
    for part in filter(None, parts):
        names.extend(_expand_one(part))
    return names


def _expand_one(part: str) -> list[str]:
    head, sep, rest = part.partition("[")
    if not sep:
        return [part]
    body, close, tail = rest.partition("]")
    if not close:
        raise ValueError(f"unbalanced hostlist {part!r}")
    out: list[str] = []
    for item in body.split(","):
        match = _HOST_RANGE.match(item)
        if match is None:
            raise ValueError(f"bad hostlist range {item!r} in {part!r}")
        lo, hi = match.group("lo"), match.group("hi") or match.group("lo")
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            out.extend(head + str(n).zfill(width) + t for t in _expand_one(tail))
    return out


def parse_gres_detail(detail: str) -> Counter[str]:
    """One node's ``gres_detail`` entry: ``"gpu:1g.10gb:1(IDX:2),shard:3(IDX:0)"`` ->
    ``{"gpu:1g.10gb": 1, "shard": 3}``."""
    held: Counter[str] = Counter()
    # commas also separate indexes inside "(IDX:0,2)": drop the parenthesised parts first
    for item in re.sub(r"\([^)]*\)", "", detail).split(","):
        match = _GRES_ITEM.fullmatch(item.strip())
        if match is None:
            continue
        name, gtype, n = match.group("name"), match.group("type"), int(match.group("n"))
        key = name if name in SHARE_GRES or not gtype else f"{name}:{gtype}"
        held[key] += n
    return held


def held_by_jobs(
    squeue: Mapping[str, Any],
    exclude: Collection[str] = (),
    submitting: Collection[tuple[str, str]] = (),
) -> dict[str, Counter[str]]:
    """Per node, the gres every job holding an allocation holds (``squeue --json``), but
    the jobs whose ids are in ``exclude``, and those whose (name, user) is in
    ``submitting``: gpuslice's jobs whose Slurm id it does not know yet (being submitted,
    or a submission that timed out), which Slurm may already run."""
    held: dict[str, Counter[str]] = {}
    for job in squeue.get("jobs") or []:
        if str(job.get("job_state", "")).upper() not in HOLDING_STATES:
            continue
        if str(job.get("job_id")) in exclude:
            continue
        if (str(job.get("name")), str(job.get("user_name"))) in submitting:
            continue
        details = job.get("gres_detail") or []
        if not details:
            continue
        nodes = expand_hostlist(str(job.get("nodes") or ""))
        # one entry per allocated node, in the order of the job's node list
        for node, detail in zip(nodes, details, strict=False):
            held.setdefault(node, Counter()).update(parse_gres_detail(str(detail)))
    return held


def steady(
    before: Mapping[str, Counter[str]], now: Mapping[str, Counter[str]]
) -> dict[str, Counter[str]]:
    """What two consecutive reads agree is held (the smaller count): a holding is kept as
    external only once it was seen twice, so a gpuslice slice whose Slurm job changes state
    between the ledger's write and Slurm's is not taken for a foreign one; anything Slurm
    freed is given back at once."""
    return {node: before[node] & now[node] for node in now.keys() & before.keys()}


def configured_gres(sinfo: Mapping[str, Any]) -> dict[str, Counter[str]]:
    """Per node, the gres it has (``sinfo --json``'s ``gres``, e.g.
    ``"gpu:a100:2,gpu:1g.10gb:1,shard:a100:8(S:0)"``), named as :func:`parse_gres_detail`."""
    return {
        str(node.get("name")): parse_gres_detail(str(node.get("gres") or ""))
        for node in sinfo.get("nodes") or []
        if node.get("name")
    }


def read_nodes(
    env: Mapping[str, str] | None = None, timeout: float = 30
) -> dict[str, Counter[str]]:
    """Every node's configured gres: one ``sinfo --json``."""
    data = json_command(["sinfo", "--json"], env, timeout)
    if not isinstance(data.get("nodes"), list):
        raise SlurmReadError("sinfo --json gave no node list")
    return configured_gres(data)


def read_held(
    env: Mapping[str, str] | None = None,
    timeout: float = 30,
    exclude: Collection[str] = (),
    submitting: Collection[tuple[str, str]] = (),
) -> dict[str, Counter[str]]:
    """What Slurm's jobs (but ``exclude`` and ``submitting``, see :func:`held_by_jobs`)
    hold now: one ``squeue --json`` (all jobs, all users)."""
    # only jobs holding an allocation: a long queue of pending jobs is no part of it
    states = ",".join(sorted(HOLDING_STATES))
    data = json_command(["squeue", "--all", "--json", f"--states={states}"], env, timeout)
    if not isinstance(data.get("jobs"), list):
        raise SlurmReadError("squeue --json gave no job list")
    return held_by_jobs(data, exclude, submitting)


# A node's base state (``sinfo --json``'s ``state``) or flag (``state_flags``) on which
# slurmctld starts no new job, in words. (MAINTENANCE and RESERVED come with a reservation,
# said from the reservation itself; POWERED_DOWN is a cloud node Slurm powers up for a job.)
OUT_STATES = {
    "down": "down",
    "error": "in error",
    "future": "not in service yet",
    "unknown": "not registered with slurmctld",
}
OUT_FLAGS = {
    "DRAIN": "drained",
    "FAIL": "failing",
    "NOT_RESPONDING": "not responding",
    "REBOOT_ISSUED": "rebooting",
    "POWER_DOWN": "to be powered down",
    "POWERING_DOWN": "powering down",
    "INVALID_REG": "registered with a configuration that does not match slurm.conf",
}


def node_out(node: Mapping[str, Any]) -> str:
    """Why slurmctld starts no new job on ``node`` (an ``sinfo --json`` node), in words;
    "" where it does. A drained node with jobs still on it is "draining"."""
    base = str(node.get("state") or "").lower()
    flags = {str(f).upper() for f in node.get("state_flags") or []}
    words = [OUT_STATES[base]] if base in OUT_STATES else []
    for flag, word in OUT_FLAGS.items():
        if flag in flags:
            busy = flag == "DRAIN" and base in ("allocated", "mixed", "completing")
            words.append("draining" if busy else word)
    if not words:
        return ""
    reason = str(node.get("reason") or "").strip()
    return f"{' and '.join(words)} in Slurm" + (f": {reason}" if reason else "")


def parse_reservations(out: str) -> list[dict[str, str]]:
    """``scontrol -o show reservation``: one ``Key=Value`` record per line."""
    records = []
    for line in out.splitlines():
        if "ReservationName=" not in line:
            continue  # ("No reservations in the system")
        record = {}
        for item in line.split():
            key, sep, value = item.partition("=")
            if sep:
                record[key] = value
        records.append(record)
    return records


def reserved_nodes(reservations: list[dict[str, str]]) -> dict[str, str]:
    """Per node, the active reservation it is in, in words. A job that is not sent into a
    reservation (``--reservation``) never runs on its nodes, and gpuslice sends no server
    there: the whole node is out, even where the reservation holds only some of its cores
    or GPUs."""
    out: dict[str, str] = {}
    for r in reservations:
        if r.get("State", "").upper() != "ACTIVE":
            continue
        nodes = r.get("Nodes", "")
        if not nodes or nodes == "(null)":
            continue
        flags = set(r.get("Flags", "").upper().split(","))
        kind = "maintenance reservation" if "MAINT" in flags else "reservation"
        for node in expand_hostlist(nodes):
            out.setdefault(node, f"in Slurm's {kind} {r.get('ReservationName', '?')}")
    return out


def read_node_states(env: Mapping[str, str] | None = None, timeout: float = 30) -> dict[str, str]:
    """Every node slurmctld starts no new job on now, and why: drained, down, failing, not
    responding (one ``sinfo --json``), or in an active reservation (one ``scontrol show
    reservation``)."""
    data = json_command(["sinfo", "--json"], env, timeout)
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise SlurmReadError("sinfo --json gave no node list")
    out = {
        str(n.get("name")): why
        for n in nodes
        if isinstance(n, dict) and n.get("name") and (why := node_out(n))
    }
    text = text_command(["scontrol", "-o", "show", "reservation"], env, timeout)
    for node, why in reserved_nodes(parse_reservations(text)).items():
        out[node] = f"{out[node]}; {why}" if node in out else why
    return out


def text_command(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> str:
    source = env if env is not None else os.environ
    try:
        out = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={k: source[k] for k in COMMAND_ENV_KEEP if k in source},
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SlurmReadError(f"{argv[0]} could not run: {e}") from e
    if out.returncode != 0:
        raise SlurmReadError(f"{argv[0]} failed: {out.stderr.strip()[:500]}")
    return out.stdout


def json_command(argv: list[str], env: Mapping[str, str] | None, timeout: float) -> dict[str, Any]:
    text = text_command(argv, env, timeout)
    try:
        data = json.loads(text)
    except ValueError as e:
        raise SlurmReadError(f"{argv[0]} --json printed no JSON: {e}") from e
    if not isinstance(data, dict):
        raise SlurmReadError(f"{argv[0]} --json printed no object")
    return data
