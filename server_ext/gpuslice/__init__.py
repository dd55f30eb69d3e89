"""gpuslice: fractional GPUs, idle reclaim and preemptible notebook jobs for JupyterHub.

This package is what runs next to the user's code (the single-user server extension,
the batch runner and the in-notebook checkpoint API) and holds the model shared with
the hub service. It must never import hub-side code.
"""

from ._version import __version__

__all__ = ["__version__"]
