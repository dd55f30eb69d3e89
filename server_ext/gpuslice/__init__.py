"""gpuslice: fractional GPUs, idle reclaim and preemptible notebook jobs for JupyterHub.

This package is what runs next to the user's code and what the hub service shares with it.
It must never import hub-side code.

The shared core, imported by the hub service too (no Jupyter server needed):
``model`` (inventory), ``gpu`` (discovery), ``vocab`` (job states, exit codes, event kinds),
``idle_policy``, ``errors``, ``jsonbody`` (request bodies), ``jsonclient`` (HTTP calls).

Next to the user's code only: ``extension`` (the single-user server extension),
``activity`` (GPU use per kernel), ``jobs_proxy`` (the lab's jobs API), ``run`` (the batch
runner) and ``checkpoint`` (the in-notebook checkpoint API). The package ships no test code:
the test doubles (the fake NVML) live in the repository's tests/fakes/.
"""

from typing import Any

from ._version import __version__

__all__ = ["__version__"]


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    # Imported here so that importing gpuslice (the hub does) needs no jupyter_server.
    from .extension.app import GPUSliceExtension

    return [{"module": "gpuslice", "app": GPUSliceExtension}]
