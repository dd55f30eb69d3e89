"""gpuslice hub service: inventory, allocation ledger, scheduler, REST API and admin panel."""

from gpuslice import __version__

__all__ = ["__version__"]
