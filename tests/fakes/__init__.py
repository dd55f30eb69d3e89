"""Test doubles that never ship in the wheel: the fake NVML driver, and the
``sitecustomize`` that puts it in place of ``pynvml`` in the processes tests start."""

FAKE_NVML_ENV = "GPUSLICE_FAKE_NVML"  # the fake driver's state file, for test subprocesses
