"""Job parameters, checked on submission (the runner injects them papermill-style)."""

from __future__ import annotations

from gpuslice.run.params import validate as validate_parameters

__all__ = ["validate_parameters"]
