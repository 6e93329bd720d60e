"""``@kernel`` and ``@gpu_kernel``: one-shot compute functions compiled by Numba (the optional
extra ``pip install resident[numba]``), beside the persistent kernels (``@ring_kernel``,
``@device_kernel``, ...) that the engine runs. PyDotCompute programs import them, with
``ring_kernel`` and ``message``, from ``resident.decorators``.

``@kernel`` compiles for CUDA (``numba.cuda.jit``) where Numba sees a CUDA device and the
target allows it, else for the CPU (``numba.njit``); ``@gpu_kernel`` always for CUDA. Both
compile on the first call (Numba specializes on the argument types then), so defining one
costs nothing and a program that defines a ``@gpu_kernel`` it never calls runs anywhere.
Without Numba, decorating raises ``NumbaNotAvailableError`` (an ``ImportError``) naming the
extra. Numba's compile errors come out as ``CompilationError`` (the cause chained)."""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any, Callable, Optional, Tuple, Union

from .errors import BackendNotAvailableError, CompilationError, InvalidConfigError, NumbaNotAvailableError

__all__ = ["kernel", "gpu_kernel", "NumbaKernel"]

Dims = Union[int, Tuple[int, ...]]
_TARGETS = ("auto", "cpu", "cuda")


def _numba() -> Any:
    try:
        return importlib.import_module("numba")
    except ImportError as e:
        raise NumbaNotAvailableError(
            "@kernel and @gpu_kernel compile with Numba, which is not installed: "
            "pip install resident[numba] (or pip install numba)"
        ) from e


def _dims(v: Optional[Dims], what: str) -> Optional[Tuple[int, ...]]:
    if v is None:
        return None
    t = (v,) if isinstance(v, int) else tuple(v)
    if not 1 <= len(t) <= 3 or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in t):
        raise InvalidConfigError(f"{what} must be 1 to 3 positive ints, got {v!r}")
    return t


def _cuda_ready(numba: Any) -> bool:
    try:
        return bool(importlib.import_module("numba.cuda").is_available())
    except Exception:  # no CUDA toolkit or driver: Numba says so by raising or by False
        return False


class NumbaKernel:
    """A Numba-compiled function, as ``@kernel``/``@gpu_kernel`` return it. Call it like the
    function: on the CPU target it runs compiled; on CUDA it launches over ``grid`` blocks of
    ``block`` threads (``grid`` by default: enough blocks to cover the first argument's
    length). ``k[grid, block](*args)`` launches a CUDA kernel with that configuration."""

    def __init__(
        self,
        func: Callable[..., Any],
        *,
        name: Optional[str],
        target: str,
        options: dict,
        signature: Optional[str] = None,
        block: Optional[Dims] = None,
        grid: Optional[Dims] = None,
    ) -> None:
        if not callable(func):
            raise InvalidConfigError(f"@kernel decorates a function, got {func!r}")
        if target not in _TARGETS:
            raise InvalidConfigError(f"device must be one of {', '.join(_TARGETS)}, got {target!r}")
        self._numba = _numba()
        self.py_func = func
        self.name = name or getattr(func, "__name__", "kernel")
        self._target = target
        self._options = options
        self._signature = signature
        self.block = _dims(block, "block")
        self.grid = _dims(grid, "grid")
        self._compiled: Any = None
        functools.update_wrapper(self, func)

    @property
    def target(self) -> str:
        """``"cpu"`` or ``"cuda"``: where it runs (``auto`` resolved, without compiling)."""
        if self._target == "auto":
            return "cuda" if _cuda_ready(self._numba) else "cpu"
        return self._target

    def _compile(self) -> Any:
        if self._compiled is not None:
            return self._compiled
        nb = self._numba
        if self.target == "cuda":
            if not _cuda_ready(nb):
                raise BackendNotAvailableError(
                    f"kernel '{self.name}' is a CUDA kernel and Numba sees no CUDA device here"
                )
            jit = importlib.import_module("numba.cuda").jit
        else:
            jit = nb.njit
        try:
            if self._signature is not None:
                self._compiled = jit(self._signature, **self._options)(self.py_func)
            else:
                self._compiled = jit(**self._options)(self.py_func)
        except nb.core.errors.NumbaError as e:
            raise CompilationError(f"kernel '{self.name}': Numba could not compile it: {e}") from e
        return self._compiled

    def _run(self, f: Callable[..., Any], args: Tuple[Any, ...], kwargs: dict) -> Any:
        try:
            return f(*args, **kwargs)
        except self._numba.core.errors.NumbaError as e:  # typing happens at the first call
            raise CompilationError(f"kernel '{self.name}': Numba could not compile it: {e}") from e

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        c = self._compile()
        if self.target == "cpu":
            return self._run(c, args, kwargs)
        block = self.block or (256,)
        grid = self.grid
        if grid is None:
            n = len(args[0]) if args and hasattr(args[0], "__len__") else 1
            grid = (max(1, math.ceil(n / math.prod(block))),)
        return self._run(c[grid, block], args, kwargs)

    def __getitem__(self, config: Tuple[Dims, Dims]) -> Callable[..., Any]:
        if self.target != "cuda":
            raise InvalidConfigError(
                f"kernel '{self.name}' runs on the CPU: call it directly (a launch "
                f"configuration k[grid, block] is for CUDA kernels)"
            )
        grid, block = config
        c = self._compile()
        return lambda *a, **kw: self._run(c[grid, block], a, kw)

    def __repr__(self) -> str:
        return f"NumbaKernel({self.name!r}, target={self._target!r})"


def kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    device: str = "auto",
    fastmath: bool = True,
    cache: bool = False,
    block: Optional[Dims] = None,
    grid: Optional[Dims] = None,
) -> Any:
    """Compiles ``func`` with Numba: ``@kernel`` or ``@kernel(block=(256,), device="cpu")``.
    ``device``: ``"auto"`` (CUDA where Numba sees a device, else the CPU), ``"cpu"`` or
    ``"cuda"``. ``block``/``grid`` are the CUDA launch configuration (unused on the CPU).
    ``cache=True`` keeps Numba's compiled code on disk beside the source."""

    def wrap(f: Callable[..., Any]) -> NumbaKernel:
        return NumbaKernel(
            f,
            name=name,
            target=device,
            options={"fastmath": fastmath, "cache": cache},
            block=block,
            grid=grid,
        )

    return wrap(func) if func is not None else wrap


def gpu_kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    name: Optional[str] = None,
    signature: Optional[str] = None,
    fastmath: bool = True,
    debug: bool = False,
    cache: bool = False,
    block: Optional[Dims] = None,
    grid: Optional[Dims] = None,
) -> Any:
    """A CUDA kernel compiled by ``numba.cuda.jit`` (with ``signature`` when given) on its
    first launch; launching it where Numba sees no CUDA device raises
    ``BackendNotAvailableError``."""

    def wrap(f: Callable[..., Any]) -> NumbaKernel:
        return NumbaKernel(
            f,
            name=name,
            target="cuda",
            options={"fastmath": fastmath, "debug": debug, "cache": cache},
            signature=signature,
            block=block,
            grid=grid,
        )

    return wrap(func) if func is not None else wrap
