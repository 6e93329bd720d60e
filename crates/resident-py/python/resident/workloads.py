"""The reference workloads of the Rust crate ``resident-workloads``, on any backend (``"cpu"``,
``"cuda"``, ``"cudasim"``, ``"wgpu"``, ``"auto"``), returning numpy arrays: full PageRank
(:func:`pagerank`), streaming PageRank (:func:`streaming_pagerank`) and anomaly detection over
sensor readings (:func:`anomaly`, a keyed kernel with one key per sensor).

Errors: bad arguments raise ``ValueError``; a backend that cannot be opened
``BackendNotAvailableError``; an engine error its own class (``resident.errors``); a run the
workload itself refuses ``WorkloadError``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

import resident._resident as _resident

__all__ = [
    "pagerank",
    "PageRankResult",
    "streaming_pagerank",
    "StreamingPageRankResult",
    "anomaly",
    "AnomalyResult",
    "ALERT_DTYPE",
    "STATS_DTYPE",
    "ALPHA",
    "Z_THRESHOLD",
    "WARMUP",
]

ALPHA = 0.01
"""The anomaly detector's EWMA weight."""
Z_THRESHOLD = 4.0
"""A reading is an anomaly when its score is above this..."""
WARMUP = 100
"""...and its sensor had seen at least this many readings before it."""

ALERT_DTYPE = np.dtype([("index", "<u8"), ("sensor", "<u8"), ("value", "<f8"), ("z", "<f8")])
"""One alert: the reading's position in the input, its sensor id, the reading, its score."""
STATS_DTYPE = np.dtype([("sensor", "<u8"), ("m", "<f8"), ("v", "<f8"), ("n", "<u8")])
"""A sensor's final statistics: its id, weighted mean, weighted variance, readings folded."""


@dataclass(frozen=True)
class PageRankResult:
    ids: np.ndarray
    """Node ids that occur in the edges, ascending."""
    ranks: np.ndarray
    """Rank of each node of ``ids`` (they sum to 1)."""
    iterations: int
    err: float
    """The last iteration's L1 change."""


def pagerank(
    edges: Any,
    *,
    damping: Optional[float] = None,
    tol: Optional[float] = None,
    max_iter: Optional[int] = None,
    backend: str = "cpu",
) -> PageRankResult:
    """Full PageRank of the graph of ``edges`` (an (E, 2) array of (src, dst) node ids, any
    non-negative integers) with the workload's ring kernel on ``backend`` (``cpu``, ``cuda``,
    ``cudasim``, ``wgpu``; device backends compute in f32). Defaults are the Rust workload's."""
    d, t, m = _resident.pagerank_defaults()
    arr = np.asarray(edges)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"edges must be an (E, 2) array of (src, dst), got shape {arr.shape}")
    if arr.size and (arr.min() < 0):
        raise ValueError("node ids must be non-negative")
    arr = np.ascontiguousarray(arr, dtype=np.uint64)
    ids, ranks, it, err = _resident.pagerank(
        arr,
        d if damping is None else damping,
        t if tol is None else tol,
        m if max_iter is None else max_iter,
        backend,
    )
    return PageRankResult(ids, ranks, it, err)


@dataclass(frozen=True)
class StreamingPageRankResult:
    ids: np.ndarray
    """Node ids that occur in the edges, ascending (the node set is fixed by ``edges``)."""
    ranks: np.ndarray
    """(batches + 1, N) float64: row 0 the initial ranks, row ``i + 1`` the ranks refreshed
    after update batch ``i`` (each row sums to 1 within the tolerance)."""
    applied: np.ndarray
    """(batches,) uint64: changes of each batch that changed the graph."""
    rejected: np.ndarray
    """(batches,) uint64: changes that did not (an add of an edge present, a remove of an edge
    absent)."""
    pushes: np.ndarray
    """(batches + 1,) uint64: node pushes of each refresh (the work it did)."""


def _update_batch(i: int, batch: Any) -> "tuple[np.ndarray, np.ndarray]":
    arr = np.asarray(batch)
    if arr.size == 0:
        return np.zeros((0, 2), np.uint64), np.zeros(0, np.int64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(
            f"update batch {i} must be a (K, 3) array of (src, dst, op), got shape {arr.shape}"
        )
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"update batch {i} must hold integers, got {arr.dtype}")
    if (arr[:, :2] < 0).any():
        raise ValueError(f"update batch {i}: node ids must be non-negative")
    ops = arr[:, 2].astype(np.int64)
    if not np.isin(ops, (1, -1)).all():
        raise ValueError(f"update batch {i}: op must be 1 (add) or -1 (remove)")
    return np.ascontiguousarray(arr[:, :2], dtype=np.uint64), np.ascontiguousarray(ops)


def streaming_pagerank(
    edges: Any,
    updates: Sequence[Any],
    *,
    damping: Optional[float] = None,
    tol: Optional[float] = None,
    max_iter: Optional[int] = None,
    backend: str = "cpu",
) -> StreamingPageRankResult:
    """Streaming PageRank: the ranks of the graph of ``edges`` (an (E, 2) array of (src, dst)
    node ids, any non-negative integers; duplicates count once) computed once, then kept up to
    date under ``updates``, a sequence of batches, each a (K, 3) integer array of
    (src, dst, op) with op ``1`` = add the edge, ``-1`` = remove it (node ids must be nodes of
    ``edges``). After each batch the kernel refreshes the ranks incrementally (residual push;
    the ranks, residual and graph stay in the kernel, on the device for device backends, which
    compute in f32). Each row is within ``d/(1-d) * N * tol`` (L1) of the exact ranks of the
    graph at that point. Defaults are the Rust workload's (networkx's)."""
    d, t, m = _resident.pagerank_defaults()
    arr = np.asarray(edges)
    if arr.ndim != 2 or arr.shape[1] != 2:
        raise ValueError(f"edges must be an (E, 2) array of (src, dst), got shape {arr.shape}")
    if arr.size and (arr.min() < 0):
        raise ValueError("node ids must be non-negative")
    arr = np.ascontiguousarray(arr, dtype=np.uint64)
    if isinstance(updates, np.ndarray) and updates.ndim == 2:
        raise ValueError("updates is a sequence of (K, 3) batches; wrap one batch in a list")
    batches = [_update_batch(i, b) for i, b in enumerate(updates)]
    ids, flat, applied, rejected, pushes = _resident.streaming_pagerank(
        arr,
        batches,
        d if damping is None else damping,
        t if tol is None else tol,
        m if max_iter is None else max_iter,
        backend,
    )
    ranks = flat.reshape(len(batches) + 1, len(ids))
    return StreamingPageRankResult(ids, ranks, applied, rejected, pushes)


@dataclass(frozen=True)
class AnomalyResult:
    alerts: np.ndarray
    """Structured array of :data:`ALERT_DTYPE`, in input order."""
    stats: np.ndarray
    """Structured array of :data:`STATS_DTYPE`: every sensor's final statistics, sensors in
    order of first appearance."""
    elapsed: float
    """Seconds for the whole run."""
    batch_latency: np.ndarray
    """Seconds per micro-batch, from sending its first reading until the kernel has processed
    its last one."""


def anomaly(
    sensors: Any,
    values: Any,
    *,
    micro_batch: int = 100,
    in_flight: int = 16,
    backend: str = "cpu",
) -> AnomalyResult:
    """Anomaly detection over the readings ``values[i]`` of sensor ``sensors[i]`` (two 1-D
    arrays of equal length; sensor ids non-negative integers, values finite) with the
    workload's detector: one keyed kernel, one key per sensor, each sensor's exponentially
    weighted mean ``m`` and variance ``v`` (``a = 0.01``) its key's state, resident in the
    kernel for the run. A sensor's first reading sets ``m = x, v = 0``; each later reading is
    scored ``z = |x - m| / sqrt(v)`` (no score while ``v = 0``), then folded in
    (``d = x - m; m += a d; v = (1 - a)(v + a d^2)``); it is an alert when ``z > 4`` and its
    sensor had seen at least 100 readings before it. Readings are sent in micro-batches of
    ``micro_batch``, at most ``in_flight`` outstanding. CPU and CUDA/CudaSim compute in f64
    (same alerts as a sequential f64 loop, statistics within 1e-9 relative); wgpu in f32."""
    s = np.asarray(sensors)
    v = np.asarray(values)
    if s.ndim != 1 or v.ndim != 1 or s.shape != v.shape:
        raise ValueError(
            f"sensors and values must be 1-D arrays of the same length, got {s.shape} and {v.shape}"
        )
    if s.size and not np.issubdtype(s.dtype, np.integer):
        raise ValueError(f"sensor ids must be integers, got {s.dtype}")
    if s.size and s.min() < 0:
        raise ValueError("sensor ids must be non-negative")
    v = np.ascontiguousarray(v, dtype=np.float64)
    if not np.isfinite(v).all():
        raise ValueError(f"reading {int(np.argmin(np.isfinite(v)))} is not finite")
    if micro_batch < 1 or in_flight < 1:
        raise ValueError("micro_batch and in_flight must be >= 1")
    (ai, asn, av, az), (sid, m, var, n), elapsed, lat = _resident.anomaly(
        np.ascontiguousarray(s, dtype=np.uint64), v, micro_batch, in_flight, backend
    )
    alerts = np.empty(len(ai), ALERT_DTYPE)
    alerts["index"], alerts["sensor"], alerts["value"], alerts["z"] = ai, asn, av, az
    stats = np.empty(len(sid), STATS_DTYPE)
    stats["sensor"], stats["m"], stats["v"], stats["n"] = sid, m, var, n
    return AnomalyResult(alerts, stats, elapsed, lat)
