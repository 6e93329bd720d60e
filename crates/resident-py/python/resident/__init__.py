"""resident: persistent actors ("ring kernels") for Python over the resident Rust engine.

>>> import asyncio
>>> from resident import RingKernelRuntime, message, ring_kernel
>>> @message
... class Ping:
...     value: int = 0
>>> @ring_kernel(kernel_id="doc_echo", queue_size=1024)
... async def doc_echo(ctx):
...     while not ctx.should_terminate:
...         if not ctx.is_active:
...             await ctx.wait_active()
...             continue
...         try:
...             msg = await ctx.receive(timeout=0.1)
...         except asyncio.TimeoutError:
...             continue
...         await ctx.send(msg.reply(value=msg.value + 1))
>>> async def main():
...     async with RingKernelRuntime(backend="cpu") as rt:
...         await rt.launch("doc_echo")
...         await rt.activate("doc_echo")
...         return (await rt.call("doc_echo", Ping(value=41), timeout=5)).value
>>> asyncio.run(main())
42
"""

from . import _resident, workloads
from .accelerator import (
    Accelerator,
    DeviceProperties,
    DeviceType,
    available_backends,
    backend_report,
    get_accelerator,
)
from .batch import BatchKernelSpec, batch_kernel
from .device import DeviceKernelSpec, declarations, device_kernel
from .dlpack import DLPackArray, DeviceView, from_dlpack
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .kernel import KernelContext, KernelSpec, get_kernel, ring_kernel
from .keyed import KeyedKernelSpec, keyed_kernel
from .memory import (
    BufferState,
    DevicePointer,
    MemoryPool,
    PoolStatistics,
    UnifiedBuffer,
    configure_memory_pool,
    get_memory_pool,
)
from .message import Message, RingKernelMessage, deserialize_message, get_message_type, message
from .runtime import KernelReport, KernelState, Runtime, Telemetry
from .ring_runtime import RingKernel, RingKernelRuntime, get_loop_info
from . import kernel  # the module, callable: PyDotCompute's ``@kernel`` (see kernel.py)
from .numba_kernels import NumbaKernel, gpu_kernel
from .orchestrator import ComputeOrchestrator, KernelExecution, KernelLaunchConfig

__version__ = _resident.__version__

__all__ = [
    "RingKernelRuntime",
    "Runtime",
    "available_backends",
    "backend_report",
    "Accelerator",
    "DeviceProperties",
    "DeviceType",
    "get_accelerator",
    "ComputeOrchestrator",
    "KernelLaunchConfig",
    "KernelExecution",
    "kernel",
    "gpu_kernel",
    "NumbaKernel",
    "get_loop_info",
    "ring_kernel",
    "batch_kernel",
    "BatchKernelSpec",
    "device_kernel",
    "DeviceKernelSpec",
    "declarations",
    "keyed_kernel",
    "KeyedKernelSpec",
    "message",
    "Message",
    "RingKernelMessage",
    "get_message_type",
    "deserialize_message",
    "RingKernel",
    "KernelState",
    "KernelContext",
    "KernelSpec",
    "KernelReport",
    "Telemetry",
    "get_kernel",
    "UnifiedBuffer",
    "BufferState",
    "DevicePointer",
    "MemoryPool",
    "PoolStatistics",
    "get_memory_pool",
    "configure_memory_pool",
    "from_dlpack",
    "DLPackArray",
    "DeviceView",
    *_errors_all,
]
