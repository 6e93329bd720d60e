"""PyDotCompute's ``ring_kernels`` module names, for programs that import from there
(``from resident.ring_kernels import RingKernelRuntime, KernelState``). Every name is the
package's own object; nothing is defined here."""

from ..kernel import KernelContext, ring_kernel
from ..runtime import KernelState, Telemetry
from ..ring_runtime import RingKernel, RingKernelRuntime, get_loop_info

# Through the submodule, so that ``message`` ends as the decorator, not the submodule of that
# name (loading a submodule sets the package's attribute).
from .message import RingKernelMessage, deserialize_message, get_message_type, message

__all__ = [
    "RingKernelRuntime",
    "RingKernel",
    "KernelState",
    "KernelContext",
    "RingKernelMessage",
    "message",
    "get_message_type",
    "deserialize_message",
    "ring_kernel",
    "Telemetry",
    "get_loop_info",
]
