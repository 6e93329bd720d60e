import asyncio
import itertools

import pytest

import resident

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
