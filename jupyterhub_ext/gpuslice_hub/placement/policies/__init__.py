"""Placement policies over :class:`~gpuslice_hub.placement.state.ClusterState`."""
