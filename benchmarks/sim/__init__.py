"""gpuslice-sim: replay a cluster's workload through the service's own decision code.

A discrete-event simulator over a virtual clock (``gpuslice_hub.clock``). The ledger,
placement, quotas, the job scheduler and the server extension's idle tracker and reclaimer
are the service's own, unchanged; the simulator supplies only time, arrivals, departures
and GPU utilization. Run ``python -m benchmarks.sim --help`` from the repository's root
(or ``benchmarks/gpuslice-sim``).
"""
