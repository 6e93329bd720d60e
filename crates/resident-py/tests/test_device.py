"""Device kernels from Python: layouts as numpy dtypes, handlers in CUDA C (CudaSim, CUDA) and
WGSL (wgpu, lavapipe in CI), each equal to the kernel's vectorized CPU form on the same input,
with the state kept on the device between batches."""

import os
import time

import numpy as np
import pytest

import resident
from conftest import fresh

IN = np.dtype([("id", "<u4"), ("x", "<f4"), ("v", "<f4", (3,)), ("k", "<i4")], align=True)
OUT = np.dtype([("id", "<u4"), ("y", "<f4"), ("s", "<f4"), ("seq", "<u4")], align=True)
STATE = np.dtype([("count", "<u4"), ("total", "<i4"), ("bias", "<f4")], align=True)

CUDA = r"""
__device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                       const Envelope* env) {
    if (in->k < 0) return false;
    out->id = in->id;
    out->y = in->x * 2.0f + state->bias;
    out->s = in->v[0] + in->v[1] + in->v[2];
    out->seq = atomicAdd(&state->count, 1u);
    atomicAdd(&state->total, in->k);
    return true;
}
"""

WGSL = r"""
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    if (input.k < 0) { return false; }
    (*out).id = input.id;
    (*out).y = input.x * 2.0 + state.bias;
    (*out).s = input.v[0] + input.v[1] + input.v[2];
    (*out).seq = atomicAdd(&state.count, 1u);
    atomicAdd(&state.total, input.k);
    return true;
}
"""


def scale(state, batch):
    """The CPU form: the same kernel, vectorized over a batch."""
    keep = batch[batch["k"] >= 0]
    out = np.zeros(len(keep), OUT)
    out["id"] = keep["id"]
    out["y"] = keep["x"] * np.float32(2) + state["bias"][0]
    out["s"] = keep["v"][:, 0] + keep["v"][:, 1] + keep["v"][:, 2]
    out["seq"] = state["count"][0] + np.arange(len(keep), dtype=np.uint32)
    state["count"] += len(keep)
    state["total"] += keep["k"].sum(dtype=np.int32)
    return out


REQUIRE = {"cudasim": "RESIDENT_REQUIRE_CUDASIM", "wgpu": "RESIDENT_REQUIRE_WGPU"}


def open_runtime(backend):
    """A runtime on `backend`, or a skip saying why the backend is absent (a failure where CI
    requires it)."""
    try:
        return resident.Runtime(backend=backend, shutdown_timeout=2.0, terminate_timeout=10.0)
    except resident.BackendNotAvailableError as e:
        var = REQUIRE.get(backend)
        if var and os.environ.get(var):
            raise
        pytest.skip(f"backend {backend} is not available here: {e}")


def declare(kid, **kw):
    init = np.zeros(1, STATE)
    init["bias"] = 0.25
    return resident.device_kernel(
        kernel_id=kid,
        in_dtype=IN,
        out_dtype=OUT,
        state_dtype=STATE,
        state=init,
        cuda=CUDA,
        wgsl=WGSL,
        max_batch=128,
        **kw,
    )(scale)


def rounds(seed=7, n_rounds=5, per_round=300):
    rng = np.random.default_rng(seed)
    out = []
    for r in range(n_rounds):
        a = np.zeros(per_round, IN)
        a["id"] = np.arange(r * per_round, (r + 1) * per_round)
        a["x"] = rng.uniform(-100, 100, per_round).astype(np.float32)
        a["v"] = rng.uniform(-10, 10, (per_round, 3)).astype(np.float32)
        a["k"] = rng.integers(-3, 10, per_round)
        out.append(a)
    return out


def receive_n(rt, kid, n, timeout=30.0):
    got, have = [], 0
    while have < n:
        g = rt.receive_batch(kid, n - have, timeout=timeout)
        assert len(g), f"kernel '{kid}': {have} of {n} outputs within {timeout} s"
        got.append(g)
        have += len(g)
    assert len(rt.receive_batch(kid, 10, timeout=0.05)) == 0, "no extra outputs"
    return np.concatenate(got)


def by_id(a):
    return a[np.argsort(a["id"], kind="stable")]


def run_rounds(backend):
    """Sends each round, waits for all its outputs, then the next: every round after the
    first sees the state the previous rounds left on the device."""
    rt = open_runtime(backend)
    kid = fresh(f"dev_{backend}")
    declare(kid)
    try:
        rt.launch(kid)
        rt.activate(kid)
        placement = rt.placement(kid)
        outs = []
        for a in rounds():
            expect = int((a["k"] >= 0).sum())
            sent = 0
            while sent < len(a):
                sent += rt.send_batch(kid, a[sent:])
            outs.append(receive_n(rt, kid, expect))
        telemetry = rt.get_telemetry(kid)
        state = rt.snapshot_state(kid)
        report = rt.terminate(kid)
        # After terminate: the final state, the same (every output was received before).
        np.testing.assert_array_equal(rt.snapshot_state(kid), state, "the final state")
        return placement, outs, telemetry, report, state
    finally:
        rt.shutdown()


def expected_rounds():
    state = np.zeros(1, STATE)
    state["bias"] = 0.25
    return [scale(state, a) for a in rounds()], state


def assert_equal_to_cpu_form(outs):
    want, _ = expected_rounds()
    assert len(outs) == len(want)
    for r, (got, exp) in enumerate(zip(outs, want)):
        assert got.dtype == OUT
        g, e = by_id(got), by_id(exp)
        np.testing.assert_array_equal(g["id"], e["id"], err_msg=f"round {r}")
        np.testing.assert_array_equal(g["y"], e["y"], err_msg=f"round {r}")
        np.testing.assert_array_equal(g["s"], e["s"], err_msg=f"round {r}")
        # The device numbers a batch's messages in whatever order its threads run, the CPU
        # form in message order: the same numbers, continuing from the previous rounds (the
        # state stayed on the device).
        np.testing.assert_array_equal(np.sort(g["seq"]), np.sort(e["seq"]), err_msg=f"round {r}")


def test_cpu_form_through_the_engine():
    with resident.Runtime(backend="cpu") as rt:
        kid = fresh("dev_cpu")
        declare(kid)
        rt.launch(kid)
        rt.activate(kid)
        assert rt.placement(kid) == "host"
        outs = []
        for a in rounds():
            rt.send_batch(kid, a)
            outs.append(receive_n(rt, kid, int((a["k"] >= 0).sum()), timeout=10))
        assert_equal_to_cpu_form(outs)
        _, final = expected_rounds()
        np.testing.assert_array_equal(rt.host_state(kid), final)
        np.testing.assert_array_equal(rt.snapshot_state(kid), final)


@pytest.mark.parametrize("backend", ["cudasim", "wgpu"])
def test_device_kernel_equals_cpu_form(backend):
    placement, outs, telemetry, report, state = run_rounds(backend)
    assert placement == backend, "the handler ran on the device, not the CPU form"
    assert_equal_to_cpu_form(outs)
    _, final = expected_rounds()
    np.testing.assert_array_equal(state, final, "the device state read back")
    n = sum(len(a) for a in rounds())
    assert telemetry.messages_processed == n
    assert report.processed == n and report.failure is None
    assert report.undelivered == [] and report.unreceived == []


def test_cuda_gpu_when_present():
    rt = None
    try:
        rt = resident.Runtime(backend="cuda")
    except resident.BackendNotAvailableError as e:
        pytest.skip(f"no CUDA GPU here: {e}")
    rt.shutdown()
    placement, outs, _, _, _ = run_rounds("cuda")
    assert placement == "cuda"
    assert_equal_to_cpu_form(outs)


WIDE_IN = np.dtype([("id", "<u8"), ("d", "<f8"), ("n", "<i8"), ("w", "<u2", (2,))], align=True)

WIDE_CUDA = r"""
__device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                       const Envelope* env) {
    out->id = in->id + (1ull << 40);
    out->d = in->d * 0.5 + 1.0;
    out->n = in->n * -3;
    out->w[0] = in->w[1];
    out->w[1] = in->w[0];
    return true;
}
"""


def wide(state, batch):
    out = batch.copy()
    out["id"] = batch["id"] + np.uint64(1 << 40)
    out["d"] = batch["d"] * 0.5 + 1.0
    out["n"] = batch["n"] * -3
    out["w"] = batch["w"][:, ::-1]
    return out


def test_cuda_64_bit_and_16_bit_fields_on_cudasim():
    rt = open_runtime("cudasim")
    kid = fresh("wide")
    resident.device_kernel(kernel_id=kid, in_dtype=WIDE_IN, cuda=WIDE_CUDA)(wide)
    try:
        rt.launch(kid)
        rt.activate(kid)
        assert rt.placement(kid) == "cudasim"
        rng = np.random.default_rng(3)
        a = np.zeros(1000, WIDE_IN)
        a["id"] = rng.integers(0, 1 << 62, 1000, dtype=np.uint64)
        a["d"] = rng.normal(0, 1e6, 1000)
        a["n"] = rng.integers(-(1 << 60), 1 << 60, 1000)
        a["w"] = rng.integers(0, 1 << 16, (1000, 2))
        assert rt.send_batch(kid, a) == 1000
        got = by_id(receive_n(rt, kid, 1000))
        np.testing.assert_array_equal(got, by_id(wide(None, a)))
    finally:
        rt.shutdown()


def test_cuda_compile_error_raises_with_the_compiler_log():
    rt = open_runtime("cudasim")
    kid = fresh("broken_cuda")
    src = CUDA.replace("out->seq = atomicAdd", "out->seq = no_such_function")
    resident.device_kernel(
        kernel_id=kid, in_dtype=IN, out_dtype=OUT, state_dtype=STATE, cuda=src
    )(scale)
    try:
        with pytest.raises(resident.CompilationError) as e:
            rt.launch(kid)
        text = str(e.value)
        assert "no_such_function" in text and "error" in text, text
        assert e.value.kernel_id == kid
        with pytest.raises(resident.KernelNotFoundError):
            rt.state(kid)
    finally:
        rt.shutdown()


def test_a_handler_that_includes_a_host_file_is_a_compilation_error_quoting_nothing():
    rt = open_runtime("cudasim")
    for include in ('#include "/etc/passwd"', "#include </dev/zero>"):
        kid = fresh("hostile_cuda")
        resident.device_kernel(
            kernel_id=kid, in_dtype=IN, out_dtype=OUT, state_dtype=STATE,
            cuda=include + "\n" + CUDA,
        )(scale)
        started = time.monotonic()
        with pytest.raises(resident.CompilationError) as e:
            rt.launch(kid)
        assert time.monotonic() - started < 10
        text = str(e.value)
        assert "asks for a file of the host" in text and "root:" not in text, text
    rt.shutdown()


FAULTING_CHILD = r'''
import faulthandler, sys
import numpy as np
import resident

faulthandler.enable()  # Python's own fault handler stays in place beside CudaSim's
IN = np.dtype([("id", "<u4"), ("k", "<i4")], align=True)
OUT = np.dtype([("id", "<u4"), ("y", "<i4")], align=True)
STATE = np.dtype([("count", "<u4")], align=True)
WILD = """
__device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                       const Envelope* env) {
    if (in->k == 13) *(volatile int*)(unsigned long long)(16 + in->id % 2) = 1;
    out->id = in->id;
    out->y = in->k * 2;
    atomicAdd(&state->count, 1u);
    return true;
}
"""
SAFE = WILD.replace("if (in->k == 13)", "if (false)")


def form(state, batch):
    out = np.zeros(len(batch), OUT)
    out["id"] = batch["id"]
    out["y"] = batch["k"] * 2
    state["count"] += len(batch)
    return out


def receive(rt, kid, n):
    got = []
    while sum(map(len, got)) < n:
        g = rt.receive_batch(kid, n, timeout=20.0)
        assert len(g), f"{kid}: no output"
        got.append(g)
    return np.concatenate(got)["y"].tolist()


for kid, src in (("wild", WILD), ("steady", SAFE), ("again", SAFE)):
    resident.device_kernel(kernel_id=kid, in_dtype=IN, out_dtype=OUT, state_dtype=STATE,
                           cuda=src)(form)
cpu = resident.Runtime(backend="cpu")
cpu.launch("steady")
cpu.activate("steady")
sim = resident.Runtime(backend="cudasim", terminate_timeout=10.0)
sim.launch("wild")
sim.activate("wild")
a = np.zeros(4, IN)
a["id"] = np.arange(4)
a["k"] = [1, 2, 3, 4]
sim.send_batch("wild", a)
assert receive(sim, "wild", 4) == [2, 4, 6, 8]
a["k"] = [5, 13, 7, 8]
sim.send_batch("wild", a)
try:
    sim.receive_batch("wild", 4, timeout=20.0)
    raise SystemExit("the faulting kernel answered")
except resident.KernelFailedError as e:
    print("FAULT", e)
report = sim.terminate("wild")
assert report.failure and "SIGSEGV" in report.failure, report
# Nothing it accepted is lost: the batch it faulted in comes back.
assert sorted(int(r["k"]) for r in report.undelivered) == [5, 7, 8, 13], report
# The CPU engine beside it kept running, and once the faulted kernel is gone the CudaSim
# context is reset and runs kernels again.
cpu.send_batch("steady", a)
assert receive(cpu, "steady", 4) == [10, 26, 14, 16]
sim.launch("again")
sim.activate("again")
sim.send_batch("again", a)
assert sorted(receive(sim, "again", 4)) == [10, 14, 16, 26]
sim.shutdown()
cpu.shutdown()
print("ALIVE")
'''


def test_a_handler_that_faults_fails_its_kernel_and_the_process_lives():
    """An illegal address in a CudaSim handler is a device fault of that kernel (typed, with
    its inputs back), not the end of the process. In a child process of its own: the fault
    loses the CudaSim context for the process until its kernels are gone."""
    import subprocess
    import sys

    open_runtime("cudasim").shutdown()  # skips where CudaSim is absent
    started = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", FAULTING_CHILD], capture_output=True, text=True, timeout=120
    )
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "ALIVE" in p.stdout, out
    assert "an illegal memory access (SIGSEGV, address not mapped at 0x1" in out, out
    assert "Fatal Python error" not in out, out
    assert time.monotonic() - started < 60


def test_a_handler_that_would_assemble_a_host_file_is_a_compilation_error():
    """`asm` spelled by token pasting, with `.incbin`, put /etc/hostname into a CudaSim kernel's
    outputs; the compiled assembly is now checked before the assembler runs."""
    src = CUDA.replace(
        "__device__ bool handle(",
        '#define PASTE(a, b) a##b\n'
        'PASTE(as, m)(".section .rodata\\n.globl resident_leak\\nresident_leak:\\n'
        '.incbin \\"/etc/hostname\\"\\n.byte 0\\n.text\\n");\n'
        'extern "C" const char resident_leak[];\n'
        "__device__ bool handle(",
        1,
    ).replace("out->id = in->id;", "out->id = in->id + resident_leak[0];", 1)
    e = refused_launch("cudasim", "leak_cuda", cuda=src)
    assert "inline assembly" in str(e), str(e)


def refused_launch(backend, prefix, **source):
    """The `CompilationError` a launch of a kernel with `source` (`cuda=` or `wgsl=`) on
    `backend` raises."""
    rt = open_runtime(backend)
    kid = fresh(prefix)
    resident.device_kernel(
        kernel_id=kid, in_dtype=IN, out_dtype=OUT, state_dtype=STATE, **source
    )(scale)
    try:
        with pytest.raises(resident.CompilationError) as e:
            rt.launch(kid)
        return e.value
    finally:
        rt.shutdown()


def test_wgsl_compile_error_raises_with_the_compiler_log():
    src = WGSL.replace("(*out).s = ", "(*out).s = undefined_name + ")
    e = refused_launch("wgpu", "broken_wgsl", wgsl=src)
    assert "undefined_name" in str(e), str(e)


def test_bad_dtypes_raise_dtype_layout_error():
    f = lambda s, b: b  # noqa: E731
    cases = [
        # a field not where C puts it (packed: the f8 at byte 4)
        (dict(in_dtype=np.dtype([("a", "<u4"), ("b", "<f8")]), cuda=CUDA), "b"),
        # a type no device has
        (dict(in_dtype=np.dtype([("a", "<c8")]), cuda=CUDA), "a"),
        (dict(in_dtype=np.dtype([("a", "<f2"), ("b", "<f2")]), cuda=CUDA), "a"),
        # WGSL has no 16-bit integers
        (dict(in_dtype=np.dtype([("a", "<u2"), ("b", "<u2")]), wgsl=WGSL), "a"),
        # nor 8-bit ones, in the state either
        (dict(in_dtype=IN, state_dtype=np.dtype([("c", "u1")]), wgsl=WGSL), "c"),
        # not a structured dtype, a nested struct, a big-endian field
        (dict(in_dtype=np.float32, cuda=CUDA), "float32"),
        (dict(in_dtype=np.dtype([("p", [("x", "<f4")])]), cuda=CUDA), "p"),
        (dict(in_dtype=np.dtype([("a", ">u4")]), cuda=CUDA), "a"),
        # a field name that is no identifier
        (dict(in_dtype=np.dtype([("a b", "<u4")]), cuda=CUDA), "a b"),
        # records past the largest record size
        (dict(in_dtype=np.dtype([("a", "<f8", (40,))]), cuda=CUDA), "exceed"),
    ]
    for kw, needle in cases:
        with pytest.raises(resident.DtypeLayoutError) as e:
            resident.device_kernel(kernel_id=fresh("bad"), **kw)(f)
        assert needle in str(e.value), (kw, str(e.value))
        assert isinstance(e.value, TypeError) and isinstance(e.value, resident.InvalidConfigError)
    with pytest.raises(ValueError):
        resident.device_kernel(kernel_id=fresh("nosrc"), in_dtype=IN)(f)
    with pytest.raises(ValueError):
        resident.device_kernel(kernel_id=fresh("two"), in_dtype=IN, state_dtype=STATE,
                               state=np.zeros(2, STATE), cuda=CUDA)(f)


def test_declarations_are_the_engines():
    c = resident.declarations(IN, OUT, STATE, lang="c")
    assert "typedef struct __attribute__((aligned(4))) {" in c
    assert "float v[3];" in c and "int k;" in c
    assert "unsigned char _resident_pad[8];" in c, "24-byte records fill a 32-byte slot"
    assert "static_assert(sizeof(StateRecord) == 16" in c, "the state padded to a power of two"
    assert "static_assert(sizeof(InRecord) == 32" in c
    assert "typedef StateRecord ResidentState;" in c
    w = resident.declarations(IN, OUT, STATE, lang="wgsl")
    assert "v: array<f32, 3>," in w and "_resident_pad: array<u32, 2>," in w
    assert "count: atomic<u32>," in w and "total: atomic<i32>," in w and "bias: f32," in w
    w64 = resident.declarations(np.dtype([("id", "<u8"), ("d", "<f8")]), lang="wgsl")
    assert "d: vec2<u32>," in w64, "64-bit fields are two words in WGSL, as in Rust"


OUT2 = np.dtype([("id", "<u4"), ("y", "<f4")])

HIST_CUDA = r"""
__device__ bool handle(ResidentState* state, const ResidentIn* in, ResidentOut* out,
                       const Envelope* env, ResidentBuffers* buffers) {
    atomicAdd(&buffers->hist[in->id % buffers->hist_len], 1u);
    out->id = in->id;
    out->y = in->x * buffers->scale[in->id % 4];
    return true;
}
"""

HIST_WGSL = r"""
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    atomicAdd(&hist[input.id % hist_len], 1u);
    (*out).id = input.id;
    (*out).y = input.x * scale[input.id % 4u];
    return true;
}
"""


def hist_cpu(state, batch, buffers):
    np.add.at(buffers["hist"], batch["id"] % len(buffers["hist"]), 1)
    out = np.zeros(len(batch), OUT2)
    out["id"] = batch["id"]
    out["y"] = batch["x"] * buffers["scale"][batch["id"] % 4]
    return out


@pytest.mark.parametrize("backend", ["cpu", "cudasim", "wgpu"])
def test_bound_buffers_read_and_written_from_python(backend):
    rt = open_runtime(backend)
    kid = fresh(f"hist_{backend}")
    scale0 = np.array([1, 2, 3, 4], np.float32)
    resident.device_kernel(
        kernel_id=kid,
        in_dtype=IN,
        out_dtype=OUT2,
        cuda=HIST_CUDA,
        wgsl=HIST_WGSL,
        buffers={"hist": np.zeros(16, np.uint32), "scale": scale0},
        atomic_buffers=("hist",),
        max_batch=64,
    )(hist_cpu)
    mine = {"hist": np.zeros(16, np.uint32), "scale": scale0.copy()}
    try:
        rt.launch(kid)
        rt.activate(kid)
        assert rt.placement(kid) == ("host" if backend == "cpu" else backend)
        a, b = rounds(n_rounds=2, per_round=500)
        rt.send_batch(kid, a)
        np.testing.assert_array_equal(by_id(receive_n(rt, kid, len(a))), hist_cpu(None, a, mine))
        np.testing.assert_array_equal(rt.read_buffer(kid, "hist"), mine["hist"])
        assert rt.read_buffer(kid, "hist").sum() == 500
        # A host write is seen whole by the next batch.
        rt.write_buffer(kid, "scale", [10, 20, 30, 40])
        mine["scale"][:] = [10, 20, 30, 40]
        rt.send_batch(kid, b)
        np.testing.assert_array_equal(by_id(receive_n(rt, kid, len(b))), hist_cpu(None, b, mine))
        np.testing.assert_array_equal(rt.read_buffer(kid, "hist"), mine["hist"])
        np.testing.assert_array_equal(rt.read_buffer(kid, "scale"), mine["scale"])
        with pytest.raises(resident.InvalidConfigError):
            rt.read_buffer(kid, "nope")
        with pytest.raises(ValueError):
            rt.write_buffer(kid, "scale", [1, 2])
    finally:
        rt.shutdown()


def test_bad_buffers_are_refused():
    f = lambda s, b, bufs: b  # noqa: E731
    with pytest.raises(resident.DtypeLayoutError):
        resident.device_kernel(kernel_id=fresh("bb"), in_dtype=IN, cuda=CUDA,
                               buffers={"m": np.zeros((2, 2), np.float32)})(f)
    with pytest.raises(resident.DtypeLayoutError):
        resident.device_kernel(kernel_id=fresh("bb"), in_dtype=IN, cuda=CUDA,
                               buffers={"m": np.zeros(2, np.complex64)})(f)
    with pytest.raises(ValueError):
        resident.device_kernel(kernel_id=fresh("bb"), in_dtype=IN, cuda=CUDA,
                               buffers={"not a name": np.zeros(2, np.float32)})(f)
    with pytest.raises(ValueError):
        resident.device_kernel(kernel_id=fresh("bb"), in_dtype=IN, wgsl=WGSL,
                               buffers={"m": np.zeros(2, np.uint32)}, atomic_buffers=("x",))(f)
    # WGSL has no 16-bit integers: refused when declared, naming the buffer.
    with pytest.raises(resident.DtypeLayoutError) as e:
        resident.device_kernel(kernel_id=fresh("b16"), in_dtype=IN, out_dtype=OUT,
                               state_dtype=STATE, wgsl=WGSL,
                               buffers={"h": np.zeros(4, np.uint16)})(f)
    assert "buffer h" in str(e.value) and "16-bit" in str(e.value), str(e.value)
    # The same buffer is fine for CUDA C.
    resident.device_kernel(kernel_id=fresh("b16c"), in_dtype=IN, cuda=CUDA,
                           buffers={"h": np.zeros(4, np.uint16)})(f)
