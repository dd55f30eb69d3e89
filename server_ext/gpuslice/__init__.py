"""gpuslice: fractional GPUs, idle reclaim and preemptible notebook jobs for JupyterHub.

This package is what runs next to the user's code (the single-user server extension,
the batch runner and the in-notebook checkpoint API) and holds the model shared with
the hub service. It must never import hub-side code.
"""

from typing import Any

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # Imported here so that importing gpuslice (the hub does) needs no jupyter_server.
    from .extension.app import GPUSliceExtension

    return [{"module": "gpuslice", "app": GPUSliceExtension}]
