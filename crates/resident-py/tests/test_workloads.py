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


# --- streaming PageRank and anomaly detection on every backend -------------------------------

from resident.workloads import ALERT_DTYPE, STATS_DTYPE, anomaly, streaming_pagerank  # noqa: E402

REQUIRE = {"cudasim": "RESIDENT_REQUIRE_CUDASIM", "wgpu": "RESIDENT_REQUIRE_WGPU"}
BACKENDS = ["cpu", "cudasim", "wgpu"]


def run_or_skip(backend, f):
    """`f()`, or a skip naming why `backend` is absent (a failure where CI requires it)."""
    try:
        return f()
    except resident.BackendNotAvailableError as e:
        var = REQUIRE.get(backend)
        if var and os.environ.get(var):
            raise
        pytest.skip(f"backend {backend} is not available here: {e}")


def ranks_of(n, pairs, d=0.85, iters=3000):
    """networkx's PageRank of the edge set `pairs` over dense nodes 0..n (dangling mass spread
    uniformly), iterated to convergence."""
    out = np.zeros(n)
    for a, _ in pairs:
        out[a] += 1
    src = np.array([a for a, _ in pairs], dtype=np.int64)
    dst = np.array([b for _, b in pairs], dtype=np.int64)
    r = np.full(n, 1.0 / n)
    for _ in range(iters):
        nr = np.zeros(n)
        if len(src):
            np.add.at(nr, dst, r[src] / out[src])
        nr = (1 - d) / n + d * (nr + r[out == 0].sum() / n)
        if np.abs(nr - r).sum() < 1e-15:
            return nr
        r = nr
    return r


def stream_case(seed=5):
    rng = np.random.default_rng(seed)
    n = 40
    ids = np.arange(n, dtype=np.uint64) * 3 + 7  # sparse ids: the wrapper maps them
    e = rng.integers(0, n, size=(160, 2))
    edges = ids[e]
    batches = []
    for _ in range(3):
        rm = e[rng.integers(0, len(e), size=6)]
        add = rng.integers(0, n, size=(6, 2))
        b = np.concatenate(
            [
                np.column_stack([ids[rm], -np.ones(len(rm), np.int64)]),
                np.column_stack([ids[add], np.ones(len(add), np.int64)]),
                # the first add once more (a duplicate), an edge between two nodes removed twice
                np.array([[ids[add[0, 0]], ids[add[0, 1]], 1]], dtype=np.int64),
                np.array([[ids[rm[0, 0]], ids[rm[0, 1]], -1]], dtype=np.int64),
            ]
        ).astype(np.int64)
        batches.append(b)
    return ids, edges, batches


def test_streaming_pagerank_matches_numpy_after_every_batch():
    for backend in BACKENDS:
        ids, edges, batches = stream_case()
        res = run_or_skip(
            backend, lambda: streaming_pagerank(edges, batches, tol=1e-12, backend=backend)
        )
        assert list(res.ids) == sorted(set(edges.ravel().tolist()))
        pos = {int(v): i for i, v in enumerate(res.ids)}
        n = len(res.ids)
        assert res.ranks.shape == (len(batches) + 1, n)
        # The reference: the edge set, changed batch by batch with set semantics.
        current = {(pos[int(a)], pos[int(b)]) for a, b in edges}
        rows = [ranks_of(n, sorted(current))]
        applied, rejected = [], []
        for b in batches:
            ok = bad = 0
            for s, t, op in b.tolist():
                edge = (pos[s], pos[t])
                if op == 1 and edge not in current:
                    current.add(edge)
                    ok += 1
                elif op == -1 and edge in current:
                    current.remove(edge)
                    ok += 1
                else:
                    bad += 1
            applied.append(ok)
            rejected.append(bad)
            rows.append(ranks_of(n, sorted(current)))
        assert list(res.applied) == applied, backend
        assert list(res.rejected) == rejected, backend
        assert min(rejected) >= 1, "every batch has a change the graph refuses"
        # f64 backends to the tolerance; wgpu computes in f32.
        atol = 1e-4 if backend == "wgpu" else 1e-9
        for i, want in enumerate(rows):
            np.testing.assert_allclose(res.ranks[i], want, atol=atol, err_msg=f"{backend} row {i}")
        # The rows differ (the updates changed the ranks), so equal rows could not pass.
        assert np.abs(rows[1] - rows[0]).sum() > 10 * atol * n


def test_streaming_pagerank_bad_input():
    ids, edges, batches = stream_case()
    with pytest.raises(ValueError, match="not a node"):
        streaming_pagerank(edges, [np.array([[7, 999_999, 1]])])
    with pytest.raises(ValueError, match="op"):
        streaming_pagerank(edges, [np.array([[7, 10, 2]])])
    with pytest.raises(ValueError):
        streaming_pagerank(edges, [np.array([1, 2, 3])])
    with pytest.raises(ValueError):
        streaming_pagerank(edges, batches[0])  # one batch, not a sequence of batches
    with pytest.raises(ValueError):
        streaming_pagerank(edges, batches, damping=1.0)
    with pytest.raises(ValueError, match="unknown backend"):
        streaming_pagerank(edges, batches, backend="tpu")
    res = streaming_pagerank(edges, [])
    assert res.ranks.shape == (1, len(res.ids)) and abs(res.ranks[0].sum() - 1) < 1e-9


def anomaly_reference(sensors, values, a=0.01, zmax=4.0, warmup=100):
    """The definition, sequentially in f64: alerts and final stats per sensor (first seen
    first)."""
    stats = {}
    alerts = []
    for i, (s, x) in enumerate(zip(sensors.tolist(), values.tolist())):
        if s not in stats:
            stats[s] = [x, 0.0, 1]
            continue
        st = stats[s]
        m, v, n = st
        z = abs(x - m) / np.sqrt(v) if v > 0 else None
        d = x - m
        st[0] = m + a * d
        st[1] = (1 - a) * (v + a * d * d)
        st[2] = n + 1
        if z is not None and z > zmax and n >= warmup:
            alerts.append((i, s, x, z))
    a_arr = np.array(alerts, dtype=ALERT_DTYPE) if alerts else np.empty(0, ALERT_DTYPE)
    s_arr = np.array([(s, *st) for s, st in stats.items()], dtype=STATS_DTYPE)
    return a_arr, s_arr


def readings(seed=11, count=6000, sensors=12, spike_every=97):
    rng = np.random.default_rng(seed)
    ids = rng.choice(10_000, size=sensors, replace=False).astype(np.uint64)
    s = ids[rng.integers(0, sensors, size=count)]
    v = (s % 50).astype(np.float64) + rng.uniform(-1, 1, size=count)
    v[spike_every::spike_every] += 40.0  # far outside: z >> 4 once warmed up
    return s, v


def test_anomaly_matches_the_numpy_reference_on_every_backend():
    s, v = readings()
    want_alerts, want_stats = anomaly_reference(s, v)
    assert len(want_alerts) > 20, "the input has anomalies"
    for backend in BACKENDS:
        for micro_batch, in_flight in [(100, 16), (1000, 1)]:
            res = run_or_skip(
                backend,
                lambda: anomaly(s, v, micro_batch=micro_batch, in_flight=in_flight, backend=backend),
            )
            assert res.alerts.dtype == ALERT_DTYPE and res.stats.dtype == STATS_DTYPE
            # Alerts: the same readings (clear spikes and calm noise: no borderline score).
            np.testing.assert_array_equal(res.alerts["index"], want_alerts["index"], backend)
            np.testing.assert_array_equal(res.alerts["sensor"], want_alerts["sensor"], backend)
            np.testing.assert_array_equal(res.alerts["value"], want_alerts["value"], backend)
            np.testing.assert_array_equal(res.stats["sensor"], want_stats["sensor"], backend)
            np.testing.assert_array_equal(res.stats["n"], want_stats["n"], backend)
            rtol = 1e-3 if backend == "wgpu" else 1e-9  # wgpu computes in f32
            np.testing.assert_allclose(res.alerts["z"], want_alerts["z"], rtol=rtol)
            np.testing.assert_allclose(res.stats["m"], want_stats["m"], rtol=rtol)
            np.testing.assert_allclose(
                np.sqrt(res.stats["v"]), np.sqrt(want_stats["v"]), rtol=rtol
            )
            assert len(res.batch_latency) == -(-len(s) // micro_batch) and res.elapsed > 0


def test_anomaly_bad_input_and_empty_input():
    s, v = readings(count=300)
    with pytest.raises(ValueError):
        anomaly(s, v[:-1])
    bad = v.copy()
    bad[5] = np.nan
    with pytest.raises(ValueError, match="reading 5"):
        anomaly(s, bad)
    with pytest.raises(ValueError):
        anomaly(s.astype(np.float64), v)
    with pytest.raises(ValueError):
        anomaly(s, v, micro_batch=0)
    with pytest.raises(ValueError, match="unknown backend"):
        anomaly(s, v, backend="tpu")
    res = anomaly(np.zeros(0, np.uint64), np.zeros(0))
    assert len(res.alerts) == 0 and len(res.stats) == 0
    # One sensor, in order: a spike as its 101st reading alerts, as its 100th it does not.
    calm = np.array([10.0 if i % 2 == 0 else 12.0 for i in range(100)])
    res = anomaly(np.full(101, 7, np.uint64), np.append(calm, 40.0))
    assert [(int(a["index"]), int(a["sensor"])) for a in res.alerts] == [(100, 7)]
    res = anomaly(np.full(100, 7, np.uint64), np.append(calm[:99], 40.0))
    assert len(res.alerts) == 0
