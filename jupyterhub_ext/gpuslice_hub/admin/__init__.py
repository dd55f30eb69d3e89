"""Read models of the admin panel: the pool right now (inventory, holders, fragmentation),
periodic usage samples for the utilization-vs-allocation plot, and per-group accounting."""
