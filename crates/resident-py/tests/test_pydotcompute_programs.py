"""Programs written for PyDotCompute 0.2.0 (its kinds: an echo actor, a batch processor) run on
resident with only their imports changed: each program below imports from ``pydotcompute``,
the test replaces that module name by ``resident`` and runs the result as a script."""

import runpy

import pytest

# An echo actor as PyDotCompute's quick start writes one: message fields without defaults,
# ``input_type``/``output_type`` on the decorator, a handler that neither checks ``is_active``
# nor passes a timeout, and the lifecycle, state, telemetry, summary, scope and buffer calls.
ECHO = r'''
import asyncio

import numpy as np

from pydotcompute import RingKernelRuntime, UnifiedBuffer, message, ring_kernel
from pydotcompute.exceptions import QueueTimeoutError
from pydotcompute.ring_kernels import KernelState


@message
class EchoRequest:
    text: str
    count: int


@message
class EchoResponse:
    text: str


@ring_kernel(kernel_id="echo", input_type=EchoRequest, output_type=EchoResponse, queue_size=256)
async def echo(ctx):
    while not ctx.should_terminate:
        msg = await ctx.receive()
        await ctx.send(EchoResponse(text=msg.text * msg.count, correlation_id=msg.message_id))


async def main():
    async with RingKernelRuntime(enable_telemetry=True) as runtime:
        kern = await runtime.launch("echo")
        assert runtime.get_kernel_state("echo") == KernelState.LAUNCHED
        await runtime.activate("echo")
        assert runtime.is_active and kern.state == KernelState.ACTIVE

        requests = [EchoRequest(text=t, count=2) for t in ("ab", "c", "xyz")]
        for r in requests:
            await runtime.send("echo", r)
        replies = [await runtime.receive("echo", timeout=5.0) for _ in requests]
        assert [r.text for r in replies] == ["abab", "cc", "xyzxyz"]
        assert [r.correlation_id for r in replies] == [r.message_id for r in requests]

        reply = await runtime.send_and_receive("echo", EchoRequest(text="z", count=3), timeout=5.0)
        assert reply.text == "zzz"
        try:
            await runtime.receive("echo", timeout=0.05)
            raise AssertionError("nothing should be left to receive")
        except QueueTimeoutError:
            pass

        await runtime.deactivate("echo")
        assert runtime.get_kernel_state("echo") == KernelState.DEACTIVATED
        await runtime.reactivate("echo")
        t = runtime.get_telemetry("echo")
        assert t.messages_processed == 4 and t.error_count == 0
        summary = runtime.get_summary()
        assert summary["kernel_count"] == 1 and summary["total_messages_processed"] == 4

        async with runtime.kernel_scope("echo2", echo):
            await runtime.send("echo2", EchoRequest(text="q", count=1))
            assert (await runtime.receive("echo2", timeout=5.0)).text == "q"

        await runtime.terminate("echo")
        assert runtime.get_telemetry("echo").messages_processed == 4
        info = runtime.get_loop_info()
        assert info["loop_class"]

    buffer = UnifiedBuffer((1000,), dtype=np.float32)
    buffer.allocate()
    buffer.host[:] = np.arange(1000, dtype=np.float32)
    buffer.mark_host_dirty()
    await buffer.ensure_on_device()
    assert buffer.device is not None and float(buffer.host.sum()) == 499500.0
    return "ok"


assert asyncio.run(main()) == "ok"
'''

# A batch processor of the seed guide's kind: collect up to 100 requests with short timeouts,
# compute on the batch with numpy, answer each with its correlation id; the client sends many
# and matches the responses by correlation id.
BATCH = r'''
import asyncio

import numpy as np

from pydotcompute import RingKernelRuntime, message, ring_kernel
from pydotcompute.core.memory_pool import get_memory_pool
from pydotcompute.ring_kernels.message import RingKernelMessage


@message
class Work:
    x: float


@message
class Result:
    y: float


@ring_kernel(kernel_id="batcher", queue_size=4096)
async def batcher(ctx):
    batch_size = 100
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        batch = []
        for _ in range(batch_size):
            try:
                batch.append(await ctx.receive(timeout=0.01))
            except asyncio.TimeoutError:
                break
        if not batch:
            continue
        xs = np.array([m.x for m in batch])
        for msg, y in zip(batch, np.sqrt(xs) + 1.0):
            await ctx.send(Result(y=float(y), correlation_id=msg.message_id))


async def main():
    pool = get_memory_pool()
    pool.enable()
    async with RingKernelRuntime() as runtime:
        await runtime.launch("batcher")
        await runtime.activate("batcher")
        work = [Work(x=float(i * i)) for i in range(1000)]
        for w in work:
            await runtime.send("batcher", w)
        by_id = {}
        while len(by_id) < len(work):
            r = await runtime.receive("batcher", timeout=10.0)
            by_id[r.correlation_id] = r
        for w in work:
            assert by_id[w.message_id].y == np.sqrt(w.x) + 1.0
        t = runtime.get_telemetry("batcher")
        assert t.messages_processed == 1000 and t.messages_dropped == 0
    restored = RingKernelMessage.deserialize(work[7].serialize())
    assert restored.x == 49.0 and restored.message_id == work[7].message_id
    assert pool.get_stats().total_bytes >= 0
    return len(by_id)


assert asyncio.run(main()) == 1000
'''


# The batch processor with its batch computed by a Numba kernel (``@kernel(block=(256,))``, as
# the seed guide writes one); needs the ``numba`` extra.
NUMBA_BATCH = BATCH.replace(
    "from pydotcompute import RingKernelRuntime, message, ring_kernel",
    "from pydotcompute import RingKernelRuntime, kernel, message, ring_kernel",
).replace(
    "@ring_kernel(kernel_id=\"batcher\"",
    """@kernel(block=(256,))
def root_plus_one(xs, out):
    for i in range(xs.shape[0]):
        out[i] = np.sqrt(xs[i]) + 1.0


@ring_kernel(kernel_id=\"batcher\"""",
).replace(
    "        for msg, y in zip(batch, np.sqrt(xs) + 1.0):",
    "        ys = np.empty_like(xs)\n        root_plus_one(xs, ys)\n        for msg, y in zip(batch, ys):",
)

try:
    import numba  # noqa: F401

    HAVE_NUMBA = True
except ImportError:
    HAVE_NUMBA = False


@pytest.mark.parametrize(
    "source",
    [
        ECHO,
        BATCH,
        pytest.param(NUMBA_BATCH, marks=pytest.mark.skipif(
            not HAVE_NUMBA, reason="numba is not installed (pip install resident[numba])")),
    ],
    ids=["echo", "batch_processor", "batch_processor_numba"],
)
def test_pydotcompute_program_runs_with_only_its_imports_changed(source, tmp_path):
    assert "pydotcompute" in source and "resident" not in source
    script = tmp_path / "program.py"
    script.write_text(source.replace("pydotcompute", "resident"))
    runpy.run_path(str(script), run_name="__main__")
