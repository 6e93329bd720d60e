"""resident.workloads.pagerank on the engine against a numpy power iteration."""

import os

import numpy as np
import pytest

import resident
from resident.workloads import pagerank


def power_iteration(ids, edges, d=0.85, iters=200):
    idx = {v: i for i, v in enumerate(ids)}
    n = len(ids)
    out = np.zeros(n)
    pairs = {(idx[a], idx[b]) for a, b in edges}
    for a, _ in pairs:
        out[a] += 1
    r = np.full(n, 1.0 / n)
    for _ in range(iters):
        nr = np.zeros(n)
        for a, b in pairs:
            nr[b] += r[a] / out[a]
        dangling = r[out == 0].sum()
        r = (1 - d) / n + d * (nr + dangling / n)
    return r


EDGES = np.array([[10, 20], [20, 30], [30, 10], [30, 40], [40, 10], [50, 40], [20, 30]])


def test_pagerank_cpu_matches_power_iteration():
    res = pagerank(EDGES, backend="cpu", tol=1e-12, max_iter=1000)
    assert list(res.ids) == [10, 20, 30, 40, 50]
    want = power_iteration(list(res.ids), EDGES.tolist(), iters=1000)
    np.testing.assert_allclose(res.ranks, want, atol=1e-9)
    assert abs(res.ranks.sum() - 1) < 1e-9 and res.iterations > 0


@pytest.mark.skipif(not os.environ.get("RESIDENT_REQUIRE_WGPU"), reason="wgpu adapter only checked in CI")
def test_pagerank_wgpu_matches_cpu():
    cpu = pagerank(EDGES, backend="cpu")
    gpu = pagerank(EDGES, backend="wgpu")
    np.testing.assert_allclose(gpu.ranks, cpu.ranks, atol=1e-4)


def test_pagerank_bad_input():
    with pytest.raises(ValueError):
        pagerank(np.array([1, 2, 3]))
    with pytest.raises(ValueError):
        pagerank(np.array([[-1, 2]]))
    with pytest.raises(ValueError):
        pagerank(EDGES, damping=1.5)
    empty = pagerank(np.zeros((0, 2), np.int64))
    assert len(empty.ids) == 0 and len(empty.ranks) == 0
