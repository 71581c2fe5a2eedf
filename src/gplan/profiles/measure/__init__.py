"""The profiler: measure layers and links on this machine (frameworks imported lazily, inside)."""
