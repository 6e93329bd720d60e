import asyncio
import itertools
import signal

import pytest

import resident

# A test process started with SIGINT ignored (a background job of a non-interactive shell: POSIX
# shells ignore SIGINT in asynchronous lists, and Python then installs no KeyboardInterrupt
# handler) would never see Ctrl-C; the Ctrl-C tests need Python's own handler.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

_ids = itertools.count()


def fresh(prefix: str) -> str:
    return f"{prefix}_{next(_ids)}"


@pytest.fixture
def rt():
    r = resident.Runtime(backend="cpu", shutdown_timeout=2.0, terminate_timeout=5.0)
    yield r
    r.shutdown()


async def echo_body(ctx):
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        try:
            msg = await ctx.receive(timeout=0.05)
        except asyncio.TimeoutError:
            continue
        await ctx.send(("echo", msg))
