"""Loaded by every Python process the tests start (tests/conftest.py puts this folder and
the repository on PYTHONPATH): with $GPUSLICE_FAKE_NVML naming a state file, ``import
pynvml`` gets the fake driver reading it. gpuslice itself has no such switch."""

import os
import sys

_state = os.environ.get("GPUSLICE_FAKE_NVML")
if _state:
    from tests.fakes.fake_pynvml import FakeNVML

    sys.modules["pynvml"] = FakeNVML.from_file(_state)  # type: ignore[assignment]
