"""Holdings outside gpuslice: what Slurm's jobs (or Kubernetes' pods) hold beyond
gpuslice's own slices.

The ledger counts devices; Slurm counts gres per node and picks the device itself. So what a
node's jobs hold (``slurmusage.read_held``) is compared, gres by gres, with what gpuslice's
own allocations on that node ask Slurm for (the spawner's translation of each grant), and
the difference is held in the ledger as ``external`` allocations on free devices of that
kind: never offered, released when Slurm no longer holds them.

A limit: gpuslice's own slices count whether or not their Slurm job runs yet (the ledger does
not know a server's Slurm job). While one waits in Slurm's queue, it "explains" a device a
foreign job holds on that node, so that device can be offered once more; the spawn on it
then waits in Slurm's queue instead of being refused.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from gpuslice.gpu.profiles import parse_mig_profile
from gpuslice_spawner.launchers.slurm import SlurmGres, gres_counts

from ..clusterview import build_hosts
from ..db.models import HostRow, utcnow
from ..placement import GPUState, HostState
from ..serialize import allocation_json
from ..snapshot import AllocationView, GPUView, InventoryView, bump_generation, load_allocation
from .allocation import AllocationMixin
from .base import ALLOCATIONS, CLAIMS
from .holders import HOLDERS, engine_of

EXTERNAL = "external"
# No hub user has an empty name: external holdings belong to nobody who could act on them.
EXTERNAL_USER = ""


def is_mig_type(gres_type: str) -> bool:
    try:
        parse_mig_profile(gres_type)
    except ValueError:
        return False
    return True


def own_gres(
    active: Iterable[AllocationView],
    gpus: Mapping[str, GPUView],
    cfg: SlurmGres,
    batch: bool = True,
) -> dict[str, Counter[str]]:
    """Per host, the gres gpuslice's own allocations ask Slurm for (``batch``: batch jobs'
    too; not when they are matched to their Slurm jobs by id instead)."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for a in active:
        if a.purpose == EXTERNAL or not a.claims or (a.purpose == "batch" and not batch):
            continue
        grant = allocation_json(a, gpus)
        try:
            out[a.host].update(gres_counts(grant, cfg))
        except ValueError:
            continue  # a grant Slurm cannot express was never submitted to Slurm
    return out


def beyond(held: Counter[str], ours: Counter[str], cfg: SlurmGres) -> Counter[str]:
    """What Slurm's jobs on one node hold beyond gpuslice's own slices there."""
    extra = Counter({key: n - ours.get(key, 0) for key, n in held.items()})
    # An untyped whole-GPU grant ("gpu") is given a typed device by Slurm ("gpu:a100"):
    # it explains a device of any whole-GPU type.
    untyped = ours.get(cfg.gpu, 0) - held.get(cfg.gpu, 0)
    for key in sorted(extra):
        name, _, gtype = key.partition(":")
        if untyped <= 0:
            break
        if name == cfg.gpu and gtype and not is_mig_type(gtype) and extra[key] > 0:
            used = min(untyped, extra[key])
            extra[key] -= used
            untyped -= used
    return +extra  # drops zero and negative counts


def inventory_gres(inv: InventoryView, cfg: SlurmGres) -> dict[str, Counter[str]]:
    """Per present host, the gres its devices are, named as Slurm names them: a MIG
    instance ``gpu:<profile>``, a whole GPU ``gpu:<type>`` (``gpu`` when its model has no
    type), and ``shard``/``mps`` for the shares of whole GPUs."""
    out: dict[str, Counter[str]] = {h.name: Counter() for h in inv.hosts if h.present}
    for gpu in inv.gpus:
        if not gpu.present or gpu.host not in out:
            continue
        instances = [m for m in gpu.mig_instances if m.present]
        if instances:
            for m in instances:
                out[gpu.host][f"{cfg.gpu}:{m.profile}"] += 1
            continue
        gtype = cfg.gpu_types.get(gpu.model)
        out[gpu.host][f"{cfg.gpu}:{gtype}" if gtype else cfg.gpu] += 1
        out[gpu.host][cfg.share] += cfg.shards_per_gpu if cfg.share == "shard" else cfg.mps_per_gpu
    return out


def gres_mismatches(
    slurm: Mapping[str, Counter[str]], ours: Mapping[str, Counter[str]], cfg: SlurmGres
) -> list[str]:
    """Where the service's hosts and Slurm's nodes disagree: what would make servers and
    jobs pinned to a host wait forever, or the ledger count devices Slurm does not have."""
    problems = []
    for host, mine in sorted(ours.items()):
        theirs = slurm.get(host)
        if theirs is None:
            problems.append(f"{host} is not a Slurm node: nothing pinned to it can start")
            continue
        whole_mine, whole_theirs = _whole(mine, cfg), _whole(theirs, cfg)
        if whole_mine != whole_theirs:
            problems.append(f"{host}: {whole_mine} whole GPU(s) here, {whole_theirs} in Slurm")
        for key in sorted(set(mine) | set(theirs)):
            if not _comparable(key, theirs, cfg):
                continue
            if mine.get(key, 0) != theirs.get(key, 0):
                problems.append(
                    f"{host}: {key} is {mine.get(key, 0)} here and {theirs.get(key, 0)} in "
                    "Slurm's gres"
                )
    return problems


def _whole(counts: Counter[str], cfg: SlurmGres) -> int:
    """Whole GPUs, typed or not (not MIG instances)."""
    return sum(
        n
        for key, n in counts.items()
        if key.partition(":")[0] == cfg.gpu and not is_mig_type(key.partition(":")[2])
    )


def _comparable(key: str, theirs: Counter[str], cfg: SlurmGres) -> bool:
    """Whether ``key``'s count can be compared one to one: MIG instances always, typed
    whole GPUs when the site names types, shares when Slurm offers them at all."""
    name, _, gtype = key.partition(":")
    if name == cfg.gpu:
        return bool(gtype) and (is_mig_type(gtype) or bool(cfg.gpu_types))
    return name == cfg.share and bool(theirs.get(key))


class ExternalMixin(AllocationMixin):
    def sync_external(
        self,
        held: Mapping[str, Counter[str]],
        cfg: SlurmGres,
        batch_by_id: bool = False,
        engine: str = "Slurm",
        all_by_id: bool = False,
    ) -> tuple[int, int, list[str]]:
        """Make the external holdings what ``held`` (per node) holds beyond gpuslice's own
        slices. Returns (allocations added, released, problems): a problem is a holding that
        found no free device of its kind on the node (the inventory and gres.conf differ).
        ``batch_by_id``: ``held`` leaves out gpuslice's own batch jobs (known by their Slurm
        ids), so the batch slices explain nothing else; ``all_by_id``: it leaves out every
        gpuslice slice (Kubernetes: their pods carry gpuslice's labels), so none explains
        anything. ``engine``: whose work ``held`` is (:data:`HOLDERS`)."""
        added = released = 0
        problems: list[str] = []
        actor, holders = engine.lower(), HOLDERS[engine]
        released_why = f"no longer held in {engine}"
        # Most passes change nothing: find that out without the allocation lock.
        with self.db.reading() as s:
            _, _, wanted, current = self._external_plan(s, held, cfg, batch_by_id, all_by_id, actor)
        keys = wanted.keys() | current.keys()
        if all(wanted.get(k, 0) == sum(_held_units(v, k[1]) for v in current[k]) for k in keys):
            return 0, 0, []
        with self.db.writing() as s:
            inv, active, wanted, current = self._external_plan(
                s, held, cfg, batch_by_id, all_by_id, actor
            )
            gone: set[int] = set()
            for (host, key), views in current.items():
                want = wanted.get((host, key), 0)
                have = sum(_held_units(v, key) for v in views)
                if have == want:
                    continue
                if _is_share(key) or want == 0:
                    excess = views  # shares are placed again whole: their pieces may differ
                elif have > want:
                    excess = sorted(views, key=lambda v: -v.id)[: have - want]
                else:
                    continue  # more to hold: added below
                for view in excess:
                    fresh = load_allocation(s, view.id)
                    if fresh is not None and fresh.active:
                        self._release(s, fresh, actor, released_why)
                        gone.add(view.id)
                        released += 1

            remaining = [a for a in active if a.id not in gone]
            hosts = {h.name: h for h in build_hosts(inv.hosts, inv.gpus, remaining, True)}
            for (host, key), want in sorted(wanted.items()):
                have = sum(
                    _held_units(v, key) for v in current.get((host, key), []) if v.id not in gone
                )
                if want <= have:
                    continue
                pieces = _take(hosts[host], key, want - have, cfg)
                for gpu, mig_uuid, milli, memory in pieces:
                    self._write_external(s, host, key, gpu, mig_uuid, milli, memory, actor, holders)
                    added += 1
                placed = sum(_piece_units(key, p) for p in pieces)
                if placed < want - have:
                    problems.append(
                        f"{host}: {holders} hold {key} that gpuslice has no free device for "
                        f"({want - have - placed} of {want - have} units)"
                    )
        return added, released, problems

    def _external_plan(
        self,
        s: Session,
        held: Mapping[str, Counter[str]],
        cfg: SlurmGres,
        batch_by_id: bool = False,
        all_by_id: bool = False,
        actor: str = "slurm",
    ) -> tuple[
        InventoryView,
        list[AllocationView],
        dict[tuple[str, str], int],
        defaultdict[tuple[str, str], list[AllocationView]],
    ]:
        """What should be held outside gpuslice, in units per (host, gres), and what is."""
        inv = self.inventory_cache.get(s)
        active = self.active_cache.get(s)
        present = {h.name for h in inv.hosts if h.present}
        ours = {} if all_by_id else own_gres(active, inv.by_uuid, cfg, batch=not batch_by_id)
        wanted: dict[tuple[str, str], int] = {}
        for node, counts in held.items():
            if node in present:
                for key, n in beyond(counts, ours.get(node, Counter()), cfg).items():
                    wanted[(node, key)] = _units(key, n, cfg)
        current: defaultdict[tuple[str, str], list[AllocationView]] = defaultdict(list)
        for a in active:
            # (one engine's mirror: another's holdings, were there two, are not its own)
            if a.purpose == EXTERNAL and a.profile.partition(":")[0] == actor:
                current[(a.host, a.server_name)].append(a)
        return inv, active, wanted, current

    def mirror_engine_out(self, out: Mapping[str, str], engine: str = "Slurm") -> list[str]:
        """Record per present host why its engine starts no new work there now (``out``:
        node -> why; a host not in it takes work): such a host is offered to nobody
        (``clusterview.build_hosts``), its holders keep what they hold. Returns the
        changes, in words."""
        want = {name: (why[:255] or None) for name, why in out.items()}
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
        if all(h.engine_out == want.get(h.name) for h in inv.hosts if h.present):
            return []  # most passes: nothing changed, no write
        changes: list[str] = []
        actor = engine.lower()
        with self.db.writing() as s:
            for row in s.scalars(select(HostRow).where(HostRow.present)):
                why = want.get(row.name)
                if row.engine_out == why:
                    continue
                row.engine_out = why
                said = f"{row.name}: {why}" if why else f"{row.name} takes work again in {engine}"
                changes.append(said)
                kind = "host-out" if why else "host-back"
                self._event(s, kind, None, actor, None, None, said, {"host": row.name})
            if changes:
                bump_generation(s)  # what is free changed: every count is made again
        return changes

    def slurm_mismatches(self, slurm: Mapping[str, Counter[str]], cfg: SlurmGres) -> list[str]:
        """:func:`gres_mismatches` of the ledger's inventory and Slurm's nodes."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
        return gres_mismatches(slurm, inventory_gres(inv, cfg), cfg)

    def _write_external(
        self,
        s: Session,
        host: str,
        key: str,
        gpu: GPUState,
        mig: str | None,
        milli: int,
        mem: int,
        actor: str = "slurm",
        holders: str = HOLDERS["Slurm"],
    ) -> None:
        kind = "share" if _is_share(key) else ("mig" if mig else "gpu")
        values: dict[str, Any] = {
            "user": EXTERNAL_USER,
            "server_name": key,
            "profile": f"{actor}:{key}",
            "kind": kind,
            "purpose": EXTERNAL,
            "priority": 0,
            "preemptible": False,
            "host": host,
            "groups": [],
            "charged_group": None,
            "borrowed": False,
            "quota_weight": 0.0,
            "gpu_milli": milli,
            "cpu_milli": 0,
            "memory_mib": 0,
            "active": True,
            "created_at": utcnow(),
            "released_at": None,
            "release_reason": None,
        }
        conn = s.connection()
        alloc_id = conn.execute(
            insert(ALLOCATIONS).values(**values).returning(ALLOCATIONS.c.id)
        ).scalar_one()
        claim = {
            "allocation_id": alloc_id,
            "gpu_uuid": gpu.uuid,
            "mig_uuid": mig,
            "milli": milli,
            "memory_mib": mem,
            "exclusive_key": mig or (gpu.uuid if kind == "gpu" else None),
            "active": True,
        }
        conn.execute(insert(CLAIMS), [claim])
        self._event(
            s,
            "allocated",
            EXTERNAL_USER,
            actor,
            alloc_id,
            values["profile"],
            f"held by {holders} that did not come through gpuslice",
            {"host": host, "purpose": EXTERNAL, "gres": key},
        )


def _is_share(key: str) -> bool:
    return key.split(":", 1)[0] in ("shard", "mps")


def _units(key: str, n: int, cfg: SlurmGres) -> int:
    """Devices (MIG instances, whole GPUs) or, for shares, milli-GPUs (rounded up: never
    offer what Slurm has handed out)."""
    if not _is_share(key):
        return n
    per_gpu = cfg.shards_per_gpu if key == "shard" else cfg.mps_per_gpu
    return math.ceil(n * 1000 / per_gpu)


def _held_units(view: AllocationView, key: str) -> int:
    return view.gpu_milli if _is_share(key) else len(view.claims)


def _piece_units(key: str, piece: tuple[GPUState, str | None, int, int]) -> int:
    return piece[2] if _is_share(key) else 1


def _take(
    host: HostState, key: str, want: int, cfg: SlurmGres
) -> list[tuple[GPUState, str | None, int, int]]:
    """Free devices of ``key``'s kind on ``host`` for ``want`` units, marked taken in
    ``host`` as they are picked; in-service devices first (a drained one is not offered
    anyway). Returns (gpu, mig uuid, milli, memory MiB) pieces."""
    name, _, gtype = key.partition(":")
    models = {model for model, t in cfg.gpu_types.items() if t == gtype}
    order: Sequence[GPUState] = sorted(host.gpus, key=lambda g: g.drained)
    pieces: list[tuple[GPUState, str | None, int, int]] = []
    if _is_share(key):
        for gpu in order:
            if want <= 0:
                break
            if gpu.mig or gpu.free_milli <= 0:
                continue
            milli = min(want, gpu.free_milli)
            gpu.free_milli -= milli
            want -= milli
            pieces.append((gpu, None, milli, 0))
        return pieces
    if name != cfg.gpu:
        return pieces
    if gtype and is_mig_type(gtype):
        for gpu in order:
            for slot in gpu.mig:
                if len(pieces) < want and slot.free and slot.profile == gtype:
                    slot.free = False
                    pieces.append((gpu, slot.uuid, slot.milli, slot.memory_mib))
        return pieces
    for gpu in order:
        whole = not gpu.mig and gpu.free_milli == 1000
        if len(pieces) < want and whole and (not models or gpu.model in models):
            gpu.free_milli = 0
            pieces.append((gpu, None, 1000, gpu.memory_mib))
    return pieces


__all__ = ["EXTERNAL", "HOLDERS", "ExternalMixin", "beyond", "engine_of", "own_gres"]
