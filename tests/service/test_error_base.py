"""One base for every exception of the three packages (issue 48: 29 classes, no common
base): ``except gpuslice.errors.GPUSliceError`` catches whatever gpuslice raises."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import gpuslice
import gpuslice_hub
import gpuslice_spawner
from gpuslice.checkpoint import Preempted
from gpuslice.errors import GPUSliceError

# Outside on purpose: a BaseException, so that a notebook's ``except Exception`` cannot
# swallow a preemption.
OUTSIDE = {Preempted}
# Imported only where their optional dependencies are (the simulator's, the demo's)
SKIPPED = ("gpuslice_hub.demo", "gpuslice_hub.migrations")


def test_every_exception_gpuslice_defines_derives_from_one_base():
    found = []
    for package in (gpuslice, gpuslice_hub, gpuslice_spawner):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.startswith(SKIPPED) or ".labextension" in info.name:
                continue
            module = importlib.import_module(info.name)
            for _, cls in inspect.getmembers(module, inspect.isclass):
                if (
                    issubclass(cls, BaseException)
                    and cls.__module__ == module.__name__
                    and not cls.__name__.startswith("_")  # (a module's own control flow)
                ):
                    found.append(cls)
    assert len(found) >= 25, found
    strays = [c for c in found if not issubclass(c, GPUSliceError) and c not in OUTSIDE]
    assert not strays, [f"{c.__module__}.{c.__qualname__}" for c in strays]
