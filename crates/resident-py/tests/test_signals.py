"""Blocking waits release the GIL and Ctrl-C (SIGINT) interrupts them."""

import os
import signal
import threading
import time

import pytest

import resident
from conftest import echo_body, fresh


@pytest.mark.skipif(os.name != "posix", reason="SIGINT delivery to the main thread")
def test_ctrl_c_interrupts_a_blocking_receive(rt):
    kid = fresh("quiet")
    rt.launch(kid, echo_body)
    rt.activate(kid)
    main = threading.main_thread().ident
    threading.Timer(0.3, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        rt.receive(kid, timeout=30)
    assert time.monotonic() - t0 < 5, "interrupted, not at the timeout"


def test_blocking_wait_releases_the_gil(rt):
    kid = fresh("gil")
    rt.launch(kid, echo_body)
    rt.activate(kid)
    ticks = 0
    stop = threading.Event()

    def spin():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1

    t = threading.Thread(target=spin)
    t.start()
    with pytest.raises(resident.ReceiveTimeoutError):
        rt.receive(kid, timeout=0.5)
    stop.set()
    t.join()
    assert ticks > 1000, "another Python thread ran while receive waited"


def test_a_runtime_left_open_does_not_hold_up_gc_or_exit(tmp_path):
    """Dropped without shutdown (garbage collected, or open at exit), a runtime shuts down
    with the GIL released: its Python kernels end at once, not after the shutdown timeout."""
    import subprocess
    import sys

    script = tmp_path / "left_open.py"
    script.write_text(
        "import asyncio, resident\n"
        "async def echo(ctx):\n"
        "    while not ctx.should_terminate:\n"
        "        try:\n"
        "            m = await ctx.receive(timeout=0.1)\n"
        "        except asyncio.TimeoutError:\n"
        "            continue\n"
        "        await ctx.send(m)\n"
        "def dropped():\n"
        "    r = resident.Runtime(backend='cpu')\n"
        "    r.launch('a', echo); r.activate('a'); assert r.call('a', 1, timeout=5) == 1\n"
        "dropped()\n"
        "kept = resident.Runtime(backend='cpu')\n"
        "kept.launch('b', echo); kept.activate('b'); assert kept.call('b', 2, timeout=5) == 2\n"
    )
    t0 = time.monotonic()
    subprocess.run([sys.executable, str(script)], check=True, timeout=60)
    assert time.monotonic() - t0 < 4, "no wait for the 5 s shutdown timeout"
