"""Batch jobs: the state machine, the scheduler, preemption and the backends that run them."""
