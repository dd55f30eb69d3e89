"""GPU memory caps on time-sliced shares without MPS.

Without MPS nothing stops a process on a shared GPU from allocating past its share, so a
kernel over the cap is warned, and after ``grace`` seconds still over it is interrupted or
shut down (``action``), or only warned again later (``"warn"``). Only that kernel.
"""

from __future__ import annotations

from collections.abc import Mapping

from .decisions import MEMORY_CULLED, MEMORY_WARNING, Decision

MEMORY_ACTIONS = ("warn", "interrupt", "shutdown")
MiB = 1024 * 1024


class MemoryCap:
    def __init__(self, cap_mib: int, action: str = "shutdown", grace: float = 60.0) -> None:
        if action not in MEMORY_ACTIONS:
            raise ValueError(f"memory action must be one of {MEMORY_ACTIONS}, got {action!r}")
        self.cap_bytes = cap_mib * MiB
        self.action = action
        self.grace = grace
        self._over_since: dict[str, float] = {}

    @property
    def enabled(self) -> bool:
        return self.cap_bytes > 0

    def observe(self, now: float, memory: Mapping[str, int | None]) -> list[Decision]:
        """*memory*: kernel id → GPU memory in bytes (None: unknown)."""
        decisions: list[Decision] = []
        for gone in set(self._over_since) - set(memory):
            del self._over_since[gone]
        if not self.enabled:
            return decisions
        cap_mib = self.cap_bytes // MiB
        for kid, used in memory.items():
            if used is None or used <= self.cap_bytes:
                self._over_since.pop(kid, None)
                continue
            # short: the lab shows it in a toast of at most 140 characters
            what = f"is over its GPU memory cap ({used // MiB} of {cap_mib} MiB)"
            since = self._over_since.get(kid)
            if since is None:
                self._over_since[kid] = now
                # (warn only: nothing follows, and the reason says nothing of it)
                then = (
                    ""
                    if self.action == "warn"
                    else f"; {self._verb()} in {self.grace:g} s if still over"
                )
                decisions.append(
                    Decision(
                        MEMORY_WARNING,
                        kid,
                        None if self.action == "warn" else now + self.grace,
                        f"kernel {what}{then}",
                        memory_bytes=used,
                    )
                )
            elif self.action != "warn" and now >= since + self.grace:
                # Warn afresh (and act again) if it stays over after the action.
                del self._over_since[kid]
                decisions.append(
                    Decision(
                        MEMORY_CULLED,
                        kid,
                        None,
                        f"kernel {what}; it was {self._verb()}",
                        memory_bytes=used,
                    )
                )
        return decisions

    def _verb(self) -> str:
        return "interrupted" if self.action == "interrupt" else "shut down"
