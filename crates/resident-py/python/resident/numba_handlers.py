"""``numba=`` handlers: a stateful actor's message handler written as a Python function and
compiled by Numba for every engine, resident on the GPU like a CUDA C handler.

The function has the CUDA C handler's meaning::

    def handle(state, inp, out, env) -> bool

``state`` is the kernel's state record (a ``@keyed_kernel``: the message's key's state; a
``@device_kernel``: the kernel's one state, shared by every message of a batch), ``inp`` the
message (a record of ``in_dtype``), ``out`` the output record to fill (of ``out_dtype``) and
``env`` the message's envelope (a record of :data:`ENVELOPE_DTYPE`: ``message_id``,
``correlation_id``, ``timestamp_ns``, ``priority``, ``flags``). ``state`` and ``out`` are
writable (``state.count += 1``, ``out.z = d``); returning False sends no output.

One function, every engine:

* **cuda**: numba-cuda compiles it to LTO-IR for the device's architecture, NVRTC the
  persistent template to LTO-IR against it, and nvJitLink links both into the kernel's
  machine code (cached on disk like every kernel);
* **cudasim**: Numba's CPU target compiles it to a native function (a ``cfunc``) that the
  CudaSim template calls on its host threads;
* **cpu** (and any engine without a device form): the same native function, called by the
  engine for each message of a keyed kernel (no Python in between); ``numba.njit`` over each
  batch for a device kernel (whose CPU form sees no envelopes: ``env`` is zeros there).

What may be written: what Numba compiles for a GPU without its runtime: arithmetic on
numbers, ``math`` functions, record fields (also fixed-size array fields, ``state.hist[3]``),
local variables, ``if``/``for``/``while``, calls of other functions Numba compiles, and global
numbers (read when the handler is compiled). What may not: Python objects, lists, dicts,
strings, exceptions, allocation (``np.zeros``), printing, I/O. Each launch checks the function
against Numba's CUDA target (when numba-cuda is installed), so a construct that cannot run on a
GPU is a ``CompilationError`` naming its line on every engine, not only on a GPU.

A ``@device_kernel``'s batch runs every message at once on a GPU (and on CudaSim's threads):
they share ``state``, so such a handler should only read it (keep per-key state in a
``@keyed_kernel``, whose messages of one key run one after another in the order sent).

Numba, numba-cuda and the NVIDIA wheels come with the extra ``pip install resident[numba]``;
without them ``numba=`` raises ``NumbaNotAvailableError`` naming it.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import linecache
import os
import re
import textwrap
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from .errors import CompilationError, NumbaNotAvailableError

__all__ = ["ENVELOPE_DTYPE", "NumbaHandler", "numba_available"]

ENVELOPE_DTYPE = np.dtype(
    [
        ("message_id", "<u8"),
        ("correlation_id", "<u8"),
        ("timestamp_ns", "<u8"),
        ("priority", "u1"),
        ("flags", "u1"),
        ("reserved0", "<u2"),
        ("reserved1", "<u4"),
    ]
)
"""The envelope a ``numba=`` handler's ``env`` is a record of (the engine's ``Envelope``, 32
bytes)."""

NO_STATE_DTYPE = np.dtype([("unused", "<u4")])
"""The state record of a kernel declared without ``state_dtype``."""

# The most characters of Numba's message a CompilationError keeps (its own text is unbounded:
# it quotes the line and every pass it went through).
_MESSAGE_CHARS = 4000

_EXTRA = "pip install 'resident[numba]'"


def _import(name: str, what: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise NumbaNotAvailableError(
            f"{what} needs {name.split('.')[0].replace('numba', 'Numba')}, which is not "
            f"installed: {_EXTRA} ({e})"
        ) from None


def numba_available() -> bool:
    """Whether Numba can be imported (``numba=`` handlers then run on the CPU engine and on
    CudaSim; the CUDA engine also needs numba-cuda)."""
    try:
        importlib.import_module("numba")
        return True
    except ImportError:
        return False


def _cuda_available() -> bool:
    try:
        importlib.import_module("numba.cuda")
        return True
    except Exception:  # numba-cuda missing, or its import failing without CUDA wheels
        return False


_CC: Dict[str, Optional[Tuple[int, int]]] = {}


def use_wheel_nvjitlink() -> Optional[str]:
    """Points the engine's nvJitLink loader (``RESIDENT_NVJITLINK``, unless already set) at
    the ``nvidia-nvjitlink`` wheel the extra installs, the one of the same CUDA release as the
    NVVM that compiles ``numba=`` handlers (nvJitLink links LTO-IR from its own release and
    older only). Returns the path, or None when the wheel is absent."""
    got = os.environ.get("RESIDENT_NVJITLINK")
    if got:
        return got
    try:
        nvidia = importlib.import_module("nvidia")
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for sub in ("cu13/lib", "nvjitlink/lib"):
            path = os.path.join(root, sub, "libnvJitLink.so.13")
            if os.path.exists(path):
                os.environ["RESIDENT_NVJITLINK"] = path
                return path
    return None


def device_cc(backend: Optional[str]) -> Optional[Tuple[int, int]]:
    """The compute capability of the ``cuda`` backend's device 0 (what its LTO-IR is compiled
    for); None for any other backend."""
    if backend != "cuda":
        return None
    if "cuda" not in _CC:
        import resident._resident as _resident

        cc = None
        for r in _resident.probe_backends():
            if r["name"] == "cuda" and r["available"] and r["devices"]:
                got = r["devices"][0]["compute_capability"]
                cc = None if got is None else (int(got[0]), int(got[1]))
        _CC["cuda"] = cc
    return _CC["cuda"]


def _identity(func: Callable[..., Any], dtypes: Tuple[np.dtype, ...]) -> str:
    """A hash of what the compiled function depends on: its code, the numbers it reads from
    its globals and closure, and the record types. Equal functions in two processes get the
    same name (so the kernel cache hits); different ones differ."""
    h = hashlib.sha256()
    code = func.__code__

    def walk(c: Any) -> None:
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if inspect.iscode(k):
                walk(k)
            else:
                h.update(repr(k).encode())

    walk(code)
    h.update(func.__qualname__.encode())
    g = func.__globals__
    for n in code.co_names:
        v = g.get(n)
        if isinstance(v, (bool, int, float, complex, np.generic)):
            h.update(f"{n}={v!r}".encode())
        elif isinstance(v, np.ndarray):  # Numba freezes a global array into the code
            h.update(f"{n}=array:{v.dtype.str}:{v.shape}".encode())
            h.update(np.ascontiguousarray(v).tobytes())
        elif callable(v) and hasattr(v, "__code__"):
            h.update(f"{n}=fn:{_identity(v, ())}".encode())
    for cell in func.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:
            continue
        if isinstance(v, (bool, int, float, complex, np.generic)):
            h.update(repr(v).encode())
        elif callable(v) and hasattr(v, "__code__"):
            h.update(_identity(v, ()).encode())
    for d in dtypes:
        h.update(repr(d.descr).encode())
        h.update(str(d.itemsize).encode())
    return h.hexdigest()[:24]


def _cache_dir() -> Optional[str]:
    """Where compiled LTO-IR is kept between processes: the engine's kernel cache folder
    (``$RESIDENT_KERNEL_CACHE``, else ``$XDG_CACHE_HOME/resident/kernels``, else
    ``~/.cache/resident/kernels``), or None."""
    d = os.environ.get("RESIDENT_KERNEL_CACHE")
    if not d:
        x = os.environ.get("XDG_CACHE_HOME")
        home = os.environ.get("HOME")
        d = os.path.join(x, "resident", "kernels") if x else (
            os.path.join(home, ".cache", "resident", "kernels") if home else None)
    return d


def _tool_versions() -> str:
    got = []
    for m in ("numba", "numba_cuda", "llvmlite"):
        try:
            got.append(f"{m}={importlib.import_module(m).__version__}")
        except Exception:
            got.append(f"{m}=?")
    return ",".join(got)


def _bounded(text: str) -> str:
    if len(text) <= _MESSAGE_CHARS:
        return text
    return text[:_MESSAGE_CHARS] + f"\n... ({len(text) - _MESSAGE_CHARS} more characters)"


def _user_line(func: Callable[..., Any], msg: str) -> str:
    """``line N: `text` `` for the first line of ``func``'s file that Numba's message names
    (``at /path/file.py (N)``), or nothing."""
    try:
        path = inspect.getsourcefile(func)
    except TypeError:
        return ""
    if not path:
        return ""
    m = re.search(re.escape(path) + r"\s*\((\d+)\)", msg) or re.search(
        re.escape(os.path.basename(path)) + r"[:\s]*\(?(\d+)\)?", msg
    )
    if m is None:
        return ""
    n = int(m.group(1))
    text = linecache.getline(path, n).strip()
    return f"line {n}: `{text}`\n" if text else f"line {n}\n"


def _where(func: Callable[..., Any]) -> str:
    try:
        return f"{inspect.getsourcefile(func)}:{func.__code__.co_firstlineno}"
    except TypeError:
        return f"line {func.__code__.co_firstlineno}"


class NumbaHandler:
    """A ``numba=`` function bound to a kernel's record types, with each engine's compiled
    form made once, on first use (every launch reuses them; a spec keeps its handler, and so
    the native function CudaSim calls, alive for the process).

    ``kind`` is ``"device"`` (a ``@device_kernel``/``@batch_kernel``: ``state`` is the
    kernel's) or ``"keyed"`` (``state`` is the message's key's)."""

    def __init__(
        self,
        func: Callable[..., Any],
        kernel_id: str,
        kind: str,
        state_dtype: Optional[np.dtype],
        in_dtype: np.dtype,
        out_dtype: np.dtype,
    ) -> None:
        if not callable(func) or not hasattr(func, "__code__"):
            raise TypeError(
                f"kernel '{kernel_id}': numba= takes a Python function "
                f"f(state, inp, out, env) -> bool, got {func!r}"
            )
        n = func.__code__.co_argcount
        if n != 4:
            raise TypeError(
                f"kernel '{kernel_id}': the numba= function {func.__name__} takes {n} "
                f"arguments; it is f(state, inp, out, env) -> bool"
            )
        self.func = func
        self.kernel_id = kernel_id
        self.kind = kind
        self.state_dtype = NO_STATE_DTYPE if state_dtype is None else np.dtype(state_dtype)
        self.in_dtype = np.dtype(in_dtype)
        self.out_dtype = np.dtype(out_dtype)
        for d, what in ((self.state_dtype, "state_dtype"), (self.in_dtype, "in_dtype"),
                        (self.out_dtype, "out_dtype")):
            if d.fields is None:
                raise TypeError(
                    f"kernel '{kernel_id}': a numba= handler's {what} must be a structured "
                    f"dtype (its fields are the record's), got {d}"
                )
        dtypes = (self.state_dtype, self.in_dtype, self.out_dtype, ENVELOPE_DTYPE)
        self.symbol = "resident_numba_" + _identity(func, dtypes)
        self._lock = threading.Lock()
        self._njit: Any = None
        self._cfunc: Any = None
        self._batch: Any = None
        self._ltoir: Dict[Tuple[int, int], bytes] = {}

    # ---- compiling ---------------------------------------------------------------------

    def _failed(self, target: str, e: BaseException) -> CompilationError:
        msg = str(e).strip()
        if isinstance(e, KeyError):  # Numba's word for a record field that does not exist
            msg = f"no record field {msg}"
        return CompilationError(
            _bounded(
                f"kernel '{self.kernel_id}': the numba= handler {self.func.__name__} "
                f"({_where(self.func)}) does not compile for {target}:\n"
                f"{_user_line(self.func, msg)}{msg}"
            ),
            self.kernel_id,
        )

    def check_fields(self) -> None:
        """Refuses, naming the line, a field of ``state``/``inp``/``out``/``env`` that its
        record does not have (Numba itself raises a bare ``KeyError`` for one)."""
        try:
            src = textwrap.dedent(inspect.getsource(self.func))
            tree = ast.parse(src)
        except (OSError, TypeError, SyntaxError):
            return  # no source to read (a lambda in a string, a REPL): Numba's error stands
        fn = next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)), None)
        if fn is None:
            return
        names = [a.arg for a in fn.args.args]
        dtypes = dict(zip(names, (self.state_dtype, self.in_dtype, self.out_dtype,
                                  ENVELOPE_DTYPE)))
        first = self.func.__code__.co_firstlineno
        lines = src.splitlines()
        for node in ast.walk(fn):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in dtypes):
                fields = dtypes[node.value.id].fields or {}
                if node.attr not in fields:
                    text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
                    raise CompilationError(
                        f"kernel '{self.kernel_id}': the numba= handler {self.func.__name__} "
                        f"({_where(self.func)}): line {first + node.lineno - 1}: "
                        f"`{text}`: {node.value.id} has no field {node.attr!r} (its fields: "
                        f"{', '.join(fields)})",
                        self.kernel_id,
                    )

    def _records(self, nb: Any) -> Tuple[Any, Any, Any, Any]:
        return tuple(
            nb.from_dtype(d)
            for d in (self.state_dtype, self.in_dtype, self.out_dtype, ENVELOPE_DTYPE)
        )  # type: ignore[return-value]

    def _check_return(self, rt: Any, target: str, nb: Any) -> None:
        if not isinstance(rt, (nb.types.Boolean, nb.types.Integer)):
            raise CompilationError(
                f"kernel '{self.kernel_id}': the numba= handler {self.func.__name__} "
                f"({_where(self.func)}) returns {rt} on {target}; it must return a bool "
                f"(True: send out)",
                self.kernel_id,
            )

    def njit(self) -> Any:
        """The function compiled by Numba's CPU target for these records (``numba.njit``)."""
        with self._lock:
            if self._njit is None:
                nb = _import("numba", "a numba= handler")
                self.check_fields()
                errors = importlib.import_module("numba.core.errors")
                sig = self._records(nb)
                try:
                    # Division by zero gives inf or nan, as on a GPU and in C (Numba's
                    # CUDA target's model), not an exception a native caller cannot take.
                    f = nb.njit(sig, error_model="numpy")(self.func)
                except (errors.NumbaError, KeyError) as e:
                    raise self._failed("the CPU (numba.njit)", e) from None
                self._check_return(f.nopython_signatures[0].return_type, "the CPU", nb)
                self._njit = f
            return self._njit

    def cfunc(self) -> Any:
        """A native function ``int f(void* state, const void* in, void* out, const void*
        env)`` (Numba's ``cfunc``) calling the handler: what CudaSim's template calls."""
        f = self.njit()
        with self._lock:
            if self._cfunc is None:
                nb = _import("numba", "a numba= handler")
                errors = importlib.import_module("numba.core.errors")
                carray = nb.carray
                ptrs = [nb.types.CPointer(r) for r in self._records(nb)]

                def native(s, i, o, e):  # type: ignore[no-untyped-def]
                    sent = f(carray(s, 1)[0], carray(i, 1)[0], carray(o, 1)[0], carray(e, 1)[0])
                    return 1 if sent else 0

                try:
                    self._cfunc = nb.cfunc(nb.types.int32(*ptrs), nopython=True)(native)
                except errors.NumbaError as e:
                    raise self._failed("CudaSim (numba.cfunc)", e) from None
            return self._cfunc

    def host_fn(self) -> int:
        """The native function's address (valid while this handler lives)."""
        return int(self.cfunc().address)

    def ltoir(self, cc: Tuple[int, int] = (9, 0)) -> bytes:
        """The handler as LTO-IR for a GPU of compute capability ``cc`` (numba-cuda; no GPU
        needed), with the C name :attr:`symbol`."""
        cc = (int(cc[0]), int(cc[1]))
        with self._lock:
            got = self._ltoir.get(cc)
            if got is not None:
                return got
            path = None
            d = _cache_dir()
            if d is not None:
                key = hashlib.sha256(
                    f"{self.symbol}:{cc}:{_tool_versions()}".encode()
                ).hexdigest()[:32]
                path = os.path.join(d, f"numba-{key}.ltoir")
                try:
                    with open(path, "rb") as fh:
                        self._ltoir[cc] = fh.read()
                    return self._ltoir[cc]
                except OSError:
                    pass
            nb = _import("numba", "a numba= handler")
            cuda = _import("numba.cuda", "a numba= handler on CUDA (numba-cuda)")
            self.check_fields()
            errors = importlib.import_module("numba.core.errors")
            sig = self._records(nb)
            try:
                # The function alone first: its return type, and errors that quote its lines.
                rt = cuda.compile(self.func, sig, device=True, cc=cc, output="ptx")[1]
                self._check_return(rt, f"a GPU (sm_{cc[0]}{cc[1]})", nb)
                # Then with the C ABI the template calls: Numba converts the bool to int.
                code, _ = cuda.compile(
                    self.func,
                    nb.types.int32(*sig),
                    device=True,
                    cc=cc,
                    abi="c",
                    abi_info={"abi_name": self.symbol},
                    output="ltoir",
                )
            except CompilationError:
                raise
            except errors.NumbaError as e:
                raise self._failed(f"a GPU (sm_{cc[0]}{cc[1]}, numba-cuda)", e) from None
            except Exception as e:  # NVVM's own errors are not NumbaErrors
                raise self._failed(f"a GPU (sm_{cc[0]}{cc[1]}, numba-cuda)", e) from None
            self._ltoir[cc] = bytes(code)
            if path is not None:
                # Whole files only: another process may read the name at any time.
                try:
                    os.makedirs(os.path.dirname(path), exist_ok=True)
                    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
                    with open(tmp, "wb") as fh:
                        fh.write(self._ltoir[cc])
                    os.replace(tmp, path)
                except OSError:
                    pass  # a read-only cache costs a compile next time, nothing else
            return self._ltoir[cc]

    def check_gpu(self) -> None:
        """Compiles for a GPU (sm_90) when numba-cuda is installed, so a construct a GPU cannot
        run is refused on every engine; nothing without numba-cuda."""
        if _cuda_available():
            self.ltoir((9, 0))

    # ---- the forms the engines take ----------------------------------------------------

    def shim(self) -> str:
        """The CUDA C handler the template compiles: it calls the compiled function by its C
        name (the template declares it: an ``extern "C" __device__`` function on a GPU, a
        function pointer on CudaSim)."""
        state = "KeyState* s" if self.kind == "keyed" else "ResidentState* s"
        return (
            f"// The numba= handler {self.func.__name__} of kernel {self.kernel_id!r}.\n"
            f"__device__ bool handle({state}, const ResidentIn* in, ResidentOut* out, "
            f"const Envelope* env) {{\n"
            f"    return {self.symbol}((void*)s, (const void*)in, (void*)out, "
            f"(const void*)env) != 0;\n}}\n"
        )

    def device_source(self, backend: Optional[str]) -> Optional[Tuple[str, Any]]:
        """The CUDA C handler and the compiled function a device spec takes on ``backend``:
        ``(shim, external)``; ``external`` None when ``backend`` is None (the layouts checked
        with the shim alone, at declaration); None on a backend with no device form (the CPU
        form runs)."""
        if backend not in (None, "cuda", "cudasim"):
            return None
        if backend is None:
            return self.shim(), None
        return self.shim(), self.external(backend, device_cc(backend))

    def external(self, backend: str, cc: Optional[Tuple[int, int]] = None) -> Tuple[Any, ...]:
        """What the engine links for ``backend``: (C name, (arch, LTO-IR) or None, native
        address or None)."""
        if backend == "cuda":
            cc = cc or (9, 0)
            use_wheel_nvjitlink()
            return (self.symbol, (f"sm_{cc[0]}{cc[1]}", self.ltoir(cc)), None)
        if backend == "cudasim":
            self.check_gpu()
            return (self.symbol, None, self.host_fn())
        raise ValueError(f"no device form of a numba= handler for the backend {backend!r}")

    def batch_runner(self) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """The CPU form of a device kernel, ``run(state, batch) -> out``: the handler over
        each message of the batch in order (``numba.njit``), outputs in message order."""
        f = self.njit()
        with self._lock:
            if self._batch is None:
                nb = _import("numba", "a numba= handler")

                @nb.njit
                def run(state, batch, out, env):  # type: ignore[no-untyped-def]
                    n = 0
                    for k in range(batch.shape[0]):
                        if f(state[0], batch[k], out[n], env[k]):
                            n += 1
                    return n

                self._batch = run
            run = self._batch
        out_dtype, in_dtype = self.out_dtype, self.in_dtype
        state_dtype = self.state_dtype

        def cpu(state: Any, batch: np.ndarray) -> np.ndarray:
            b = np.ascontiguousarray(batch).view(in_dtype).reshape(-1)
            st = state if state is not None else np.zeros(1, state_dtype)
            out = np.zeros(len(b), out_dtype)
            env = np.zeros(len(b), ENVELOPE_DTYPE)
            n = run(st.view(state_dtype).reshape(-1), b, out, env)
            return out[:n]

        return cpu

    def lazy_batch_runner(self) -> Callable[[Any, np.ndarray], np.ndarray]:
        """:meth:`batch_runner`, compiled on its first call (on the kernel's thread, not at
        declaration): the host form a ``@batch_kernel(numba=...)`` runs."""
        got: Dict[str, Any] = {}

        def run(state: Any, batch: np.ndarray) -> np.ndarray:
            f = got.get("f")
            if f is None:
                f = got.setdefault("f", self.batch_runner())
            return f(state, batch)

        return run
