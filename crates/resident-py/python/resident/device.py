"""Device kernels: message and state layouts as numpy structured dtypes, the handler as CUDA C
(run on ``cuda`` and ``cudasim``) or WGSL (run on ``wgpu``), and the same kernel's CPU form as
a vectorized Python function over a numpy batch, ``def handle(state, batch) -> out``.

The C and WGSL struct declarations are generated from the dtypes by the engine's own generator
(the one Rust's ``device_message!`` uses), so a field lies at the same byte on the host and on
the device or the dtype is refused with a ``DtypeLayoutError`` naming the field. A handler
that does not compile raises ``CompilationError`` at ``launch`` with the compiler's log (g++
for CudaSim, NVRTC for CUDA, naga for WGSL).

Records move as whole arrays (``send_batch``/``receive_batch``), as for ``@batch_kernel``:
every record is padded to the engine's record size (8 to 256 bytes), and the generated
structs carry that padding as a trailing ``_resident_pad`` field.

The handlers see (CUDA C, every thread of a batch shares ``state``: use atomics)::

    __device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                           const Envelope* env);

and (WGSL; ``state`` is a module variable whose 32-bit integer fields are atomics)::

    fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool

Returning false sends no output.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import resident._resident as _resident
from ._dtypes import kernel_dtypes
from .batch import BatchKernelSpec, RECORD_SIZES
from .errors import DtypeLayoutError
from .kernel import _registry, reject_unknown
from . import numba_handlers as _numba

__all__ = ["device_kernel", "DeviceKernelSpec", "declarations", "link_numba_cubin"]

STATE_SIZES = tuple(4 << i for i in range(11))

_CODES = {"f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"}

Field = Tuple[str, str, List[int], int]

# Words a field name cannot be: it becomes a struct member in the generated CUDA C (compiled
# as C++ by g++ for CudaSim and by NVRTC) or WGSL.
_C_KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false float for friend goto if inline int long mutable
    namespace new noexcept not not_eq nullptr operator or or_eq private protected public
    register reinterpret_cast requires restrict return short signed sizeof static
    static_assert static_cast struct switch template this thread_local throw true try typedef
    typeid typename union unsigned using virtual void volatile wchar_t while xor xor_eq
    _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn _Static_assert
    _Thread_local NULL
    """.split()
)
# WGSL's keywords, reserved words and predeclared type names (WGSL spec, 3.5 and 3.6).
_WGSL_KEYWORDS = frozenset(
    """
    alias break case const const_assert continue continuing default diagnostic discard else
    enable false fn for if let loop override requires return struct switch true var while
    NULL Self abstract active alignas alignof as asm asm_fragment async attribute auto await
    become binding_array cast catch class co_await co_return co_yield coherent column_major
    common compile compile_fragment concept const_cast consteval constexpr constinit crate
    debugger decltype delete demote demote_to_helper do dynamic_cast enum explicit export
    extends extern external fallthrough filter final finally friend from fxgroup get goto
    groupshared highp impl implements import inline instanceof interface layout lowp macro
    macro_rules match mediump meta mod module move mut mutable namespace new nil noexcept
    noinline nointerpolation non_coherent noncoherent noperspective null nullptr of operator
    package packoffset partition pass patch pixelfragment precise precision premerge priv
    protected pub public readonly ref regardless register reinterpret_cast require resource
    restrict self set shared sizeof smooth snorm static static_assert static_cast std
    subroutine super target template this thread_local throw trait try type typedef typeid
    typename typeof union unless unorm unsafe unsized use using varying virtual volatile wgsl
    where with writeonly yield
    array atomic bool f16 f32 i32 u32 mat2x2 mat2x3 mat2x4 mat3x2 mat3x3 mat3x4 mat4x2 mat4x3
    mat4x4 ptr sampler sampler_comparison vec2 vec3 vec4
    """.split()
)


def _check_names(dtype: Optional[np.dtype], what: str, c: bool, wgsl: bool) -> None:
    """Refuses a field name the generated C (``c``) or WGSL (``wgsl``) could not declare."""
    if dtype is None or dtype.fields is None:
        return
    for name in dtype.fields:
        if not _IDENT.match(name) or name.startswith(("__", "resident_", "_resident")):
            raise DtypeLayoutError(
                f"{what}: field name {name!r} is not an identifier the generated code can "
                f"use (letters, digits and _, not starting with a digit, '__' or "
                f"'resident_')",
                None,
                name,
            )
        for on, words, lang in ((c, _C_KEYWORDS, "C/C++ (CUDA)"), (wgsl, _WGSL_KEYWORDS, "WGSL")):
            if on and name in words:
                raise DtypeLayoutError(
                    f"{what}: field name '{name}' is a keyword or reserved word of {lang}, "
                    f"where the handler's struct declares it; rename the field (e.g. "
                    f"'{name}_')",
                    None,
                    name,
                )


def _fields(dtype: np.dtype, what: str) -> List[Field]:
    """The dtype's fields as ``(name, code, dims, offset)``, in offset order."""
    if dtype.fields is None:
        raise DtypeLayoutError(
            f"{what}: {dtype} is not a structured dtype (give fields, e.g. "
            f"np.dtype([('x', '<f4'), ('id', '<u4')]))"
        )
    out: List[Field] = []
    for name, spec in sorted(dtype.fields.items(), key=lambda kv: kv[1][1]):
        ft, offset = spec[0], spec[1]
        base, dims = (ft.subdtype[0], list(ft.subdtype[1])) if ft.subdtype else (ft, [])
        if base.fields is not None:
            raise DtypeLayoutError(
                f"{what}: field '{name}' is a nested struct; flatten it into scalar fields",
                None,
                name,
            )
        if base.byteorder == ">" or (base.byteorder == "=" and np.little_endian is False):
            raise DtypeLayoutError(f"{what}: field '{name}' is big-endian", None, name)
        code = f"{base.kind}{base.itemsize}"
        if base.kind not in "fiu" or code not in _CODES:
            raise DtypeLayoutError(
                f"{what}: field '{name}' of type {base} has no device type (float32, float64, "
                f"int8-int64, uint8-uint64)",
                None,
                name,
            )
        out.append((name, code, dims, offset))
    return out


def _natural_size(fields: List[Field]) -> int:
    """The size C gives a struct of these fields (the engine checks the offsets)."""
    at, align = 0, 1
    for _, code, dims, offset in fields:
        a = int(code[1:])
        at = max(at, offset) + a * int(np.prod(dims, dtype=np.int64) if dims else 1)
        align = max(align, a)
    return -(-at // align) * align


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _code(dt: np.dtype) -> str:
    return f"{dt.kind}{dt.itemsize}"


def _buffer(kernel_id: str, name: str, values: Any) -> np.ndarray:
    """A bound buffer's initial values: a 1-D array of one device scalar type."""
    if not isinstance(name, str) or not _IDENT.match(name) or name.startswith(("__", "resident_")):
        raise ValueError(
            f"kernel '{kernel_id}': buffer name {name!r} is not an identifier (the handler "
            f"names it)"
        )
    arr = np.array(values, copy=True)
    dt = arr.dtype
    if arr.ndim != 1 or dt.fields is not None or _code(dt) not in _CODES or dt.kind not in "fiu" \
            or dt.byteorder == ">":
        raise DtypeLayoutError(
            f"kernel '{kernel_id}': buffer '{name}' must be a 1-D array of float32, float64, "
            f"int8-int64 or uint8-uint64 (little-endian), got {arr.ndim}-D {dt}",
            kernel_id,
            name,
        )
    return arr


def _with_buffers(func: Any, buffers: Dict[str, np.ndarray], state: Any, batch: Any) -> Any:
    return func(state, batch, buffers)


def _state_array(state: Any, dtype: Optional[np.dtype]) -> Optional[np.ndarray]:
    if dtype is None:
        if state is not None:
            raise ValueError("a state value needs its state_dtype")
        return None
    if state is None:
        return np.zeros(1, dtype)
    arr = np.array(state, dtype=dtype).reshape(-1)
    if arr.shape != (1,):
        raise ValueError(f"the state is one record of {dtype}, got {arr.shape[0]}")
    return arr


@dataclass(frozen=True)
class DeviceKernelSpec(BatchKernelSpec):
    """A device kernel: a batch kernel whose handler also exists as CUDA C and/or WGSL."""

    state_dtype: Optional[np.dtype] = None
    cuda: Optional[str] = None
    wgsl: Optional[str] = None
    function: str = "handle"
    wgsl_in_order: bool = False
    workgroup_size: int = 64
    buffers: Dict[str, np.ndarray] = field(default_factory=dict)
    atomic_buffers: Tuple[str, ...] = ()
    numba: Any = None
    """The ``numba=`` handler (a ``NumbaHandler``), or None."""

    def __post_init__(self) -> None:
        if self.numba is not None:
            if self.cuda is not None or self.wgsl is not None:
                raise ValueError(
                    f"kernel '{self.kernel_id}': numba= is the kernel's handler on every "
                    f"engine; it takes no cuda= or wgsl= beside it"
                )
            if self.buffers:
                raise ValueError(
                    f"kernel '{self.kernel_id}': a numba= handler takes no bound buffers "
                    f"(f(state, inp, out, env) only)"
                )
        if self.state_dtype is not None and not isinstance(self.state_dtype, np.dtype):
            object.__setattr__(self, "state_dtype", np.dtype(self.state_dtype))
        _state_array(self.state, self.state_dtype)
        object.__setattr__(
            self, "buffers", {n: _buffer(self.kernel_id, n, v) for n, v in self.buffers.items()}
        )
        object.__setattr__(self, "atomic_buffers", tuple(self.atomic_buffers))
        for n in self.atomic_buffers:
            if n not in self.buffers:
                raise ValueError(f"kernel '{self.kernel_id}': atomic buffer '{n}' is not bound")
        super().__post_init__()
        k = f"kernel '{self.kernel_id}'"
        for d, n in ((self.in_dtype, "in_dtype"), (self.out_dtype, "out_dtype"),
                     (self.state_dtype, "state_dtype")):
            _check_names(d, f"{k} {n}", self.cuda is not None or self.numba is not None,
                         self.wgsl is not None)
        self.device_spec()  # refuses a dtype the device cannot hold, now

    @property
    def record(self) -> int:
        need = max(
            self.in_dtype.itemsize,
            self.out_dtype.itemsize,
            _natural_size(_fields(self.in_dtype, f"kernel '{self.kernel_id}' in_dtype")),
            _natural_size(_fields(self.out_dtype, f"kernel '{self.kernel_id}' out_dtype")),
        )
        for s in RECORD_SIZES:
            if s >= need:
                return s
        raise DtypeLayoutError(
            f"kernel '{self.kernel_id}': records of {need} bytes exceed {RECORD_SIZES[-1]}",
            self.kernel_id,
        )

    @property
    def state_size(self) -> int:
        """Bytes of the device state: the state dtype padded to a power of two (4 to 4096),
        so the engine can read it back."""
        if self.state_dtype is None:
            return 0
        k = f"kernel '{self.kernel_id}' state_dtype"
        need = max(_natural_size(_fields(self.state_dtype, k)), self.state_dtype.itemsize)
        for s in STATE_SIZES:
            if s >= need:
                return s
        raise DtypeLayoutError(
            f"{k}: a state of {need} bytes exceeds {STATE_SIZES[-1]} (keep large data in "
            f"buffers)",
            self.kernel_id,
        )

    def initial_state(self) -> Optional[np.ndarray]:
        """A fresh copy of the initial state (one record of ``state_dtype``)."""
        return _state_array(self.state, self.state_dtype)

    def device_spec(self, backend: Optional[str] = None) -> Any:
        """The engine's checked description of the layouts and sources. A ``numba=`` handler
        is compiled for ``backend`` (``"cuda"``, ``"cudasim"``: None for any other, which runs
        its CPU form; None: the layouts are checked with its C shim only)."""
        cuda, external = self.cuda, None
        if self.numba is not None:
            got = self.numba.device_source(backend)
            if got is None:
                return None
            cuda, external = got
        k = f"kernel '{self.kernel_id}'"
        st = self.initial_state()
        sfields = None if self.state_dtype is None else _fields(self.state_dtype, f"{k} state_dtype")
        ssize = 0
        if sfields is not None:
            ssize = self.state_size
        init = None
        if st is not None:
            raw = np.zeros(ssize, np.uint8)
            raw[: st.dtype.itemsize] = st.view(np.uint8)
            init = raw.tobytes()
        try:
            return _resident.DeviceSpec(
                self.record,
                _fields(self.in_dtype, f"{k} in_dtype"),
                _fields(self.out_dtype, f"{k} out_dtype"),
                sfields,
                ssize,
                init,
                cuda,
                self.wgsl,
                self.function,
                self.wgsl_in_order,
                self.workgroup_size,
                (
                    f"the numpy dtype {self.in_dtype}",
                    f"the numpy dtype {self.out_dtype}",
                    f"the numpy dtype {self.state_dtype}",
                ),
                list(self.atomic_buffers),
                [(n, _code(v.dtype)) for n, v in self.buffers.items()],
                external,
            )
        except DtypeLayoutError as e:
            raise DtypeLayoutError(f"{k}: {e}", self.kernel_id, e.detail) from None

    def initial_buffers(self) -> Dict[str, np.ndarray]:
        """Fresh copies of the bound buffers' initial values."""
        return {n: v.copy() for n, v in self.buffers.items()}

    def buffer_args(self) -> List[Tuple[str, str, bytes]]:
        """The bound buffers as the engine takes them: name, scalar code, bytes."""
        return [(n, _code(v.dtype), v.tobytes()) for n, v in self.buffers.items()]

    def cpu_func(self, buffers: Dict[str, np.ndarray]) -> Callable[..., Any]:
        """The CPU form as the batch runner calls it, ``f(state, batch)``."""
        if self.numba is not None:
            return self.numba.batch_runner()
        if not self.buffers:
            return self.func
        return functools.partial(_with_buffers, self.func, buffers)

    def declarations(self, lang: str = "c") -> str:
        """The declarations generated for the handler: ``"c"`` (CUDA) or ``"wgsl"``."""
        return self.device_spec().declarations(lang)


_DEVICE_KERNEL_ARGS = (
    "kernel_id", "in_dtype", "out_dtype", "state_dtype", "state", "cuda", "wgsl", "function",
    "wgsl_in_order", "workgroup_size", "buffers", "atomic_buffers", "queue_size",
    "backpressure", "block_timeout", "max_batch", "numba",
)


def device_kernel(
    func: Optional[Callable[..., Any]] = None,
    *,
    kernel_id: Optional[str] = None,
    in_dtype: Any,
    out_dtype: Any = None,
    state_dtype: Any = None,
    state: Any = None,
    cuda: Optional[str] = None,
    wgsl: Optional[str] = None,
    function: str = "handle",
    wgsl_in_order: bool = False,
    workgroup_size: int = 64,
    buffers: Optional[Dict[str, Any]] = None,
    atomic_buffers: Tuple[str, ...] = (),
    queue_size: int = 4096,
    backpressure: str = "block",
    block_timeout: float = 1.0,
    max_batch: int = 1024,
    numba: Any = None,
    **unknown: Any,
) -> Any:
    """Declares a device kernel whose CPU form is ``def handle(state, batch) -> out``.

    ``in_dtype``/``out_dtype``/``state_dtype`` are numpy structured dtypes (fields of float32,
    float64, int8-int64, uint8-uint64 and fixed arrays of them, at the offsets C gives them:
    build them with ``align=True`` when in doubt). ``state`` is the initial state (one record
    of ``state_dtype``; zeros by default). ``cuda`` is the handler in CUDA C (run on a
    ``cuda`` or ``cudasim`` runtime), ``wgsl`` in WGSL (run on ``wgpu``); on any other runtime
    the decorated function runs on a host thread, called with the kernel's state (a 1-record
    array it may update in place) and each drained batch. ``wgsl_in_order`` runs a WGSL
    batch's messages one after another in one invocation.

    ``buffers`` binds named 1-D arrays of one scalar type to the kernel for its life (each
    launch starts from a copy of the values given here): the CUDA handler takes a fifth
    argument ``ResidentBuffers* buffers`` (``buffers->name``, ``buffers->name_len``), the WGSL
    handler sees ``name: array<T>`` and ``name_len`` (``atomic_buffers`` lists those it
    updates with atomics), and the CPU form is called ``handle(state, batch, buffers)`` with a
    dict of numpy arrays. ``Runtime.read_buffer``/``write_buffer`` reach them from the host.

    ``numba=f`` declares the kernel with ``f(state, inp, out, env) -> bool``, compiled by
    Numba, as its handler on every engine (``resident.numba_handlers``; no ``cuda``/``wgsl``
    beside it): the call returns ``f``, registered; ``@device_kernel(..., numba=True)`` over
    ``f`` is the same. Any other keyword argument raises ``UnknownArgumentError`` naming the
    closest known one.
    """
    reject_unknown("@device_kernel", unknown, _DEVICE_KERNEL_ARGS)

    def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
        kid = kernel_id or f.__name__
        handler = None
        in_dt, out_dt, st_dt = kernel_dtypes(in_dtype, out_dtype, state_dtype)
        if numba is not None and numba is not False:
            handler = _numba.NumbaHandler(f, kid, "device", st_dt, in_dt, out_dt)
        spec = DeviceKernelSpec(
            kernel_id=kid,
            func=f,
            in_dtype=in_dt,
            out_dtype=out_dt,
            state=state,
            queue_size=queue_size,
            backpressure=backpressure,
            block_timeout=block_timeout,
            max_batch=max_batch,
            state_dtype=st_dt,
            cuda=cuda,
            wgsl=wgsl,
            function=function,
            wgsl_in_order=wgsl_in_order,
            workgroup_size=workgroup_size,
            buffers=dict(buffers or {}),
            atomic_buffers=tuple(atomic_buffers),
            numba=handler,
        )
        f._ring_kernel_spec = spec  # type: ignore[attr-defined]
        _registry[spec.kernel_id] = spec  # type: ignore[assignment]
        return f

    if func is not None:
        return wrap(func)
    if callable(numba) and numba is not True:
        return wrap(numba)
    return wrap


def declarations(
    in_dtype: Any,
    out_dtype: Any = None,
    state_dtype: Any = None,
    lang: str = "c",
) -> str:
    """The C (``lang="c"``) or WGSL (``"wgsl"``) declarations a device kernel with these
    dtypes is compiled with: ``InRecord``/``OutRecord``/``StateRecord`` and the aliases
    ``ResidentIn``/``ResidentOut``/``ResidentState``."""
    in_dt, out_dt, st_dt = kernel_dtypes(in_dtype, out_dtype, state_dtype)
    spec = DeviceKernelSpec(
        kernel_id="declarations",
        func=lambda s, b: b,
        in_dtype=in_dt,
        out_dtype=out_dt,
        state_dtype=st_dt,
        cuda="" if lang != "wgsl" else None,
        wgsl="" if lang == "wgsl" else None,
    )
    return spec.declarations(lang)


def link_numba_cubin(handler: Any, sm: Tuple[int, int] = (9, 0), kernel_id: Optional[str] = None) -> bytes:
    """A ``numba=`` handler (``resident.numba_handlers.NumbaHandler``) linked into the
    persistent kernel's machine code for a GPU of compute capability ``sm`` (NVRTC and
    nvJitLink, no GPU needed): the CUBIN such a device loads. A keyed handler is linked into the
    device template with its key's state as the state (the same C call). Raises
    ``CompilationError`` when it does not link, ``NumbaNotAvailableError`` without nvJitLink."""
    _numba.use_wheel_nvjitlink()
    kid = kernel_id or handler.kernel_id
    ir = handler.ltoir(sm)
    shim = handler.shim().replace("KeyState* s", "ResidentState* s")
    st = handler.state_dtype
    size = next(z for z in STATE_SIZES if z >= max(st.itemsize, 4))
    record = next(z for z in RECORD_SIZES
                  if z >= max(handler.in_dtype.itemsize, handler.out_dtype.itemsize))
    spec = _resident.DeviceSpec(
        record,
        _fields(handler.in_dtype, "in_dtype"),
        _fields(handler.out_dtype, "out_dtype"),
        _fields(st, "state_dtype"),
        size,
        bytes(size),
        shim,
        None,
        "handle",
        False,
        64,
        ("in_dtype", "out_dtype", "state_dtype"),
        [],
        [],
        (handler.symbol, (f"sm_{sm[0]}{sm[1]}", ir), None),
    )
    return bytes(spec.link_cubin(kid, f"sm_{sm[0]}{sm[1]}"))
