"""JupyterHub spawners that start each server on a gpuslice slice."""

from .spawner import GPUSliceMixin, GPUSliceSimpleSpawner, GPUSliceSpawner, SliceRefused

__all__ = ["GPUSliceMixin", "GPUSliceSimpleSpawner", "GPUSliceSpawner", "SliceRefused"]
