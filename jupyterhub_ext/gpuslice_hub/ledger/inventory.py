"""The inventory side of the ledger: discovery's hosts, GPUs and MIG instances written in,
and GPUs drained for maintenance."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from gpuslice.model import Inventory

from ..db.models import (
    GPURow,
    HostRow,
    MigRow,
)
from ..errors import Refused
from ..snapshot import (
    bump_generation,
)
from .base import (
    LedgerBase,
)


class InventoryMixin(LedgerBase):
    def sync_inventory(self, inventory: Inventory) -> None:
        """Upsert what discovery found; mark what vanished as absent (holders keep it)."""
        with self.db.writing() as s:
            seen_hosts, seen_gpus, seen_mig = set(), set(), set()
            for h in inventory.hosts:
                seen_hosts.add(h.name)
                old = s.get(HostRow, h.name)
                s.merge(
                    HostRow(
                        name=h.name,
                        cpu_milli=h.cpu_milli,
                        memory_mib=h.memory_mib,
                        present=True,
                        # the engine's word stands until its next pass (slurmsync.py)
                        engine_out=old.engine_out if old is not None else None,
                    )
                )
                for g in h.gpus:
                    seen_gpus.add(g.uuid)
                    row = s.get(GPURow, g.uuid)
                    drained = row.drained if row is not None else False
                    s.merge(
                        GPURow(
                            uuid=g.uuid,
                            host=h.name,
                            index=g.index,
                            model=g.model,
                            memory_mib=g.memory_mib,
                            mig_mode=g.mig_mode.value,
                            present=True,
                            drained=drained,
                        )
                    )
                    for m in g.mig_instances:
                        seen_mig.add(m.uuid)
                        s.merge(
                            MigRow(
                                uuid=m.uuid,
                                gpu_uuid=g.uuid,
                                profile=m.profile,
                                memory_mib=m.memory_mib,
                                milli=m.milli,
                                present=True,
                            )
                        )
            s.flush()
            for hrow in s.scalars(select(HostRow)):
                hrow.present = hrow.name in seen_hosts
            for grow in s.scalars(select(GPURow)):
                grow.present = grow.uuid in seen_gpus
            for mrow in s.scalars(select(MigRow)):
                mrow.present = mrow.uuid in seen_mig
            bump_generation(s)
            self._event(
                s,
                "inventory",
                None,
                "service",
                reason=f"{inventory.backend}: {len(seen_hosts)} hosts, {len(seen_gpus)} GPUs, "
                f"{len(seen_mig)} MIG instances",
                detail={"backend": inventory.backend, "simulated": inventory.simulated},
            )

    def set_drained(self, gpu_uuid: str, drained: bool, actor: str, reason: str) -> dict[str, Any]:
        with self.db.writing() as s:
            row = s.get(GPURow, gpu_uuid)
            if row is None:
                raise Refused("not_found", f"no GPU {gpu_uuid!r} in the inventory")
            changed = row.drained != drained
            row.drained = drained
            if changed:
                bump_generation(s)
                kind = "gpu-drained" if drained else "gpu-undrained"
                detail = {"gpu": gpu_uuid, "host": row.host, "index": row.index}
                self._event(s, kind, None, actor, None, None, reason or None, detail)
            return {"uuid": gpu_uuid, "drained": drained, "changed": changed}
