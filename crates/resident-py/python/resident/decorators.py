"""The module PyDotCompute programs import their decorators from: ``kernel`` and
``gpu_kernel`` (Numba one-shot kernels, ``resident.numba_kernels``), ``ring_kernel``
(``resident.kernel``) and ``message`` (``resident.message``). Names only: no logic here."""

from .kernel import ring_kernel
from .message import message
from .numba_kernels import NumbaKernel, gpu_kernel, kernel

__all__ = ["kernel", "gpu_kernel", "NumbaKernel", "ring_kernel", "message"]
