"""PyDotCompute's ``ring_kernels.lifecycle`` names (the package's own objects)."""

from ..kernel import KernelContext
from ..runtime import KernelState
from ..ring_runtime import RingKernel

__all__ = ["KernelState", "RingKernel", "KernelContext"]
