"""terminate and shutdown racing 4 sender threads under every policy: every message a send
accepted is processed, dropped (counted) or handed back, exactly once."""

import asyncio
import threading
import time

import pytest

import resident
from conftest import fresh

POLICIES = ["block", "reject", "drop_oldest", "drop_newest"]


async def sink(ctx):
    # Processes by collecting into the kernel's own list (no outputs to account for).
    while not ctx.should_terminate:
        if not ctx.is_active:
            await ctx.wait_active()
            continue
        try:
            m = await ctx.receive(timeout=0.01)
        except asyncio.TimeoutError:
            continue
        SEEN.append(m)


SEEN: list = []


def race(policy: str, how: str):
    SEEN.clear()
    r = resident.Runtime(backend="cpu", shutdown_timeout=0.2, terminate_timeout=5.0)
    kid = fresh(f"race_{policy}_{how}")
    r.launch(kid, sink, queue_size=64, priority_lanes=2, backpressure=policy, block_timeout=0.01)
    r.activate(kid)
    accepted = [[] for _ in range(4)]
    refused = [[] for _ in range(4)]
    stop = threading.Event()

    errors = []

    def sender(t):
        try:
            send_all(t)
        except BaseException as e:  # reported by the test, not lost in the thread
            errors.append(e)

    def send_all(t):
        i = 0
        while not stop.is_set() and i < 20000:
            m = (t, i)
            try:
                r.send(kid, m, priority=(i * 37) % 256)
                accepted[t].append(m)
            except resident.ResidentError as e:
                assert e.message == m, "a refused send hands its message back"
                refused[t].append(m)
                if isinstance(e, resident.KernelNotAcceptingError):
                    return
            i += 1

    ts = [threading.Thread(target=sender, args=(t,)) for t in range(4)]  # noqa: B023
    for t in ts:
        t.start()
    time.sleep(0.15)
    if how == "terminate":
        rep = r.terminate(kid)
    else:
        rep = r.shutdown()[0]
    stop.set()
    for t in ts:
        t.join()
    assert not errors, errors
    tel_dropped = rep.dropped
    acc = [m for a in accepted for m in a]
    processed = list(SEEN)
    back = list(rep.undelivered) + ([rep.failed_message] if rep.failed_message is not None else [])
    assert rep.failure is None, rep.failure
    assert rep.processed == len(processed)
    ends = processed + back
    assert len(set(ends)) == len(ends), "no message ends twice"
    assert set(ends) <= set(acc)
    missing = len(acc) - len(ends)
    if policy.startswith("drop"):
        assert missing == tel_dropped, (missing, tel_dropped)
    else:
        assert missing == 0 and tel_dropped == 0
    r.shutdown()
    return len(acc)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("how", ["terminate", "shutdown"])
def test_race_accounts_for_every_message(policy, how):
    assert race(policy, how) > 0
