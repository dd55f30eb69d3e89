"""The allocation ledger, in parts with one concern each: its shared state (``base``), the
inventory (``inventory``), allocation and release (``allocation``), what Slurm holds
outside gpuslice (``external``), what is free as people
read it (``capacity``) and the records besides allocations (``records``)."""

from __future__ import annotations

from .allocation import AllocationMixin
from .base import PURPOSES, RECLAIM_KINDS, REFUSALS, Caller, LedgerBase
from .external import ExternalMixin
from .inventory import InventoryMixin
from .records import RecordsMixin


class Ledger(ExternalMixin, AllocationMixin, InventoryMixin, RecordsMixin, LedgerBase):
    """The ledger: see each part's module."""


__all__ = ["PURPOSES", "RECLAIM_KINDS", "REFUSALS", "Caller", "Ledger", "LedgerBase"]
