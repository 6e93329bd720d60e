"""PyDotCompute's ``core`` module names, for programs that import from there
(``from resident.core import UnifiedBuffer, MemoryPool``). Every name is the package's own
object; nothing is defined here."""

from ..accelerator import Accelerator, DeviceProperties, DeviceType, get_accelerator
from ..memory import BufferState, MemoryPool, PoolStatistics, UnifiedBuffer
from ..memory import configure_memory_pool, get_memory_pool
from ..orchestrator import ComputeOrchestrator, KernelExecution, KernelLaunchConfig

__all__ = [
    "Accelerator",
    "DeviceProperties",
    "DeviceType",
    "get_accelerator",
    "UnifiedBuffer",
    "BufferState",
    "MemoryPool",
    "PoolStatistics",
    "get_memory_pool",
    "configure_memory_pool",
    "ComputeOrchestrator",
    "KernelLaunchConfig",
    "KernelExecution",
]
