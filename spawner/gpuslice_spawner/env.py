"""The environment a granted slice gives the single-user server."""

from __future__ import annotations

import json
from typing import Any


def slice_env(
    grant: dict[str, Any], service_url: str, mps_pipe_directory: str = ""
) -> dict[str, str]:
    """CUDA and GPUSLICE_* variables for a grant (the server extension reads the GPUSLICE_*
    ones to know its slice, memory cap and idle policy)."""
    assignments = grant.get("assignments") or []
    devices = [a.get("mig_uuid") or a["gpu_uuid"] for a in assignments]
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(devices),
        # device order as NVML reports it, so index-based tools agree with the uuids above
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPUSLICE_SERVICE_URL": service_url,
        "GPUSLICE_ALLOCATION_ID": str(grant["id"]),
        "GPUSLICE_PROFILE": str(grant.get("profile", "")),
        "GPUSLICE_PROFILE_KIND": str(grant.get("kind", "")),
        "GPUSLICE_PROFILE_DISPLAY_NAME": str(grant.get("display_name") or grant.get("profile", "")),
        "GPUSLICE_HOST": str(grant.get("host", "")),
        "GPUSLICE_GPU_MILLI": str(sum(int(a.get("milli", 0)) for a in assignments)),
        "GPUSLICE_SLICE": json.dumps(assignments, separators=(",", ":")),
    }
    if grant.get("kind") == "share" and assignments:
        cap = int(assignments[0].get("memory_mib") or 0)
        env["GPUSLICE_MEMORY_CAP_MIB"] = str(cap)
        if mps_pipe_directory:
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_directory
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(
                max(1, int(assignments[0]["milli"]) // 10)
            )
            if cap:
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={cap}M"
    if grant.get("idle_timeout") is not None:
        env["GPUSLICE_IDLE_TIMEOUT"] = str(grant["idle_timeout"])
    if grant.get("simulated"):
        env["GPUSLICE_SIMULATED"] = "1"
    return env
