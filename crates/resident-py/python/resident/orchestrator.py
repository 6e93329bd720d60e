"""``ComputeOrchestrator``: runs one-shot compute functions (``@kernel``/``@gpu_kernel`` or any
function) from asyncio without holding the loop, and keeps a record of each run."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from .accelerator import Accelerator, get_accelerator
from .numba_kernels import NumbaKernel
from .errors import InvalidConfigError, KernelNotFoundError
from .memory import MemoryPool, get_memory_pool
from .runtime import _in_thread

__all__ = ["ComputeOrchestrator", "KernelLaunchConfig", "KernelExecution"]


def _tuple(v: Any, what: str) -> Tuple[int, ...]:
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in t):
        raise InvalidConfigError(f"{what} must be 1 to 3 positive ints, got {v!r}")
    return t


@dataclass
class KernelLaunchConfig:
    """A launch configuration: ``grid_size`` blocks of ``block_size`` threads (ints or up to
    three dimensions) for a CUDA kernel; a CPU function ignores it."""

    grid_size: Union[int, Tuple[int, ...]] = (1,)
    block_size: Union[int, Tuple[int, ...]] = (256,)
    shared_memory_bytes: int = 0
    stream: Any = None

    def __post_init__(self) -> None:
        self.grid_size = _tuple(self.grid_size, "grid_size")
        self.block_size = _tuple(self.block_size, "block_size")


@dataclass
class KernelExecution:
    """One run: its name, configuration, start and end (``time.perf_counter`` seconds),
    whether it succeeded and the exception if it did not."""

    execution_id: uuid.UUID = field(default_factory=uuid.uuid4)
    kernel_name: str = ""
    config: KernelLaunchConfig = field(default_factory=KernelLaunchConfig)
    start_time: float = 0.0
    end_time: float = 0.0
    success: bool = False
    error: Optional[BaseException] = None

    @property
    def duration_ms(self) -> float:
        return (self.end_time - self.start_time) * 1000.0


class ComputeOrchestrator:
    """``async with ComputeOrchestrator() as o: await o.launch_kernel(f, config, *args)``.

    A coroutine function is awaited; a CUDA ``@kernel``/``@gpu_kernel`` is launched with the
    configuration, and any other function (a CPU ``@kernel`` included) is called, both on a
    thread of its own, so the loop goes on meanwhile. Kernels may be registered by name.
    Entering takes the process's ``Accelerator`` and memory pool (enabled); leaving frees the
    pool's idle memory."""

    def __init__(self) -> None:
        self._accelerator: Optional[Accelerator] = None
        self._memory_pool: Optional[MemoryPool] = None
        self._kernels: Dict[str, Callable[..., Any]] = {}
        self._history: List[KernelExecution] = []
        self._active = False

    async def __aenter__(self) -> "ComputeOrchestrator":
        await self.initialize()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.shutdown()

    async def initialize(self) -> None:
        if self._active:
            return
        self._accelerator = await _in_thread(get_accelerator)  # the probe opens devices
        self._memory_pool = get_memory_pool()
        self._memory_pool.enable()
        self._active = True

    async def shutdown(self) -> None:
        if not self._active:
            return
        if self._memory_pool is not None:
            self._memory_pool.free_all_blocks()
        self._active = False

    @property
    def is_active(self) -> bool:
        return self._active

    @property
    def accelerator(self) -> Optional[Accelerator]:
        return self._accelerator

    @property
    def memory_pool(self) -> Optional[MemoryPool]:
        return self._memory_pool

    def register_kernel(self, name: str, kernel_func: Callable[..., Any]) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidConfigError(f"a kernel's name must be a non-empty str, got {name!r}")
        if not callable(kernel_func):
            raise InvalidConfigError(f"kernel '{name}': expected a callable, got {kernel_func!r}")
        self._kernels[name] = kernel_func

    def get_kernel(self, name: str) -> Optional[Callable[..., Any]]:
        return self._kernels.get(name)

    async def launch_kernel(
        self,
        kernel: Union[Callable[..., Any], str],
        config: Optional[KernelLaunchConfig] = None,
        *args: Any,
        **kwargs: Any,
    ) -> KernelExecution:
        """Runs ``kernel`` (a function or a registered name) with ``args`` and returns the
        run's record (also kept: ``get_execution_history``). An exception of the kernel is
        recorded and raised."""
        if isinstance(kernel, str):
            f = self._kernels.get(kernel)
            if f is None:
                raise KernelNotFoundError(f"no kernel '{kernel}' is registered here", kernel)
            name = kernel
        else:
            if not callable(kernel):
                raise InvalidConfigError(f"launch_kernel takes a function or a name, got {kernel!r}")
            f, name = kernel, getattr(kernel, "__name__", type(kernel).__name__)
        cfg = config if config is not None else KernelLaunchConfig()
        if not isinstance(cfg, KernelLaunchConfig):
            raise InvalidConfigError(f"config must be a KernelLaunchConfig, got {cfg!r}")
        run = KernelExecution(kernel_name=name, config=cfg, start_time=time.perf_counter())
        try:
            if isinstance(f, NumbaKernel) and f.target == "cuda":
                # The first launch compiles: on a thread, as every other function runs.
                await _in_thread(lambda: f[cfg.grid_size, cfg.block_size](*args, **kwargs))
            elif asyncio.iscoroutinefunction(f):
                await f(*args, **kwargs)
            else:
                r = await _in_thread(f, *args, **kwargs)
                if asyncio.iscoroutine(r):
                    await r
            run.success = True
        except Exception as e:
            run.error = e
            raise
        finally:
            run.end_time = time.perf_counter()
            self._history.append(run)
        return run

    def create_stream(self) -> None:
        """None: resident hands out no CUDA streams (its kernels own theirs)."""
        return None

    def synchronize(self) -> None:
        if self._accelerator is not None:
            self._accelerator.synchronize()

    def get_execution_history(
        self, limit: Optional[int] = None, kernel_name: Optional[str] = None
    ) -> List[KernelExecution]:
        h = [e for e in self._history if kernel_name is None or e.kernel_name == kernel_name]
        return h[-limit:] if limit else h

    def clear_execution_history(self) -> None:
        self._history.clear()

    def __repr__(self) -> str:
        return f"ComputeOrchestrator(active={self._active}, kernels={len(self._kernels)})"
