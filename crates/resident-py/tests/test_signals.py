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
