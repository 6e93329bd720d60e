"""The reference workloads of the Rust crate ``resident-workloads``, on any backend, returning
numpy arrays. Only full PageRank is wrapped so far (streaming PageRank and anomaly detection
are not)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _resident

__all__ = ["pagerank", "PageRankResult"]


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
