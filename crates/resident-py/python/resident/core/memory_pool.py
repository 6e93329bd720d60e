"""PyDotCompute's ``core.memory_pool`` names (the package's own objects)."""

from ..memory import MemoryPool, PoolStatistics, configure_memory_pool, get_memory_pool

__all__ = ["MemoryPool", "PoolStatistics", "get_memory_pool", "configure_memory_pool"]
