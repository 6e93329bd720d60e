"""PyDotCompute's ``ring_kernels.runtime`` names (the package's own objects)."""

from ..ring_runtime import RingKernelRuntime

__all__ = ["RingKernelRuntime"]
