"""The seed workloads' actors written in Python (``numba=`` handlers, see
``resident.numba_handlers``), beside their CUDA C twins from ``resident-workloads``: the anomaly
detector (a keyed kernel, each sensor's running statistics its key's state) and the pipeline's
two stages (normalize, then score).

Each ``declare_*`` function declares one kernel, written either way (``lang="numba"`` or
``lang="cuda"``), with the same records; :func:`run_anomaly` and :func:`run_pipeline` run them
on any backend and return every output and final state, so the two forms can be compared
record for record (``tests/test_numba_handlers.py`` does, on cpu and cudasim)."""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

import resident._resident as _resident
from .device import device_kernel
from .errors import SendTimeoutError
from .keyed import keyed_kernel

__all__ = [
    "READING_DTYPE",
    "ALERT_DTYPE",
    "SENSOR_STATS_DTYPE",
    "RAW_DTYPE",
    "NORMALIZED_DTYPE",
    "SCORED_DTYPE",
    "FLUSH",
    "anomaly_detect",
    "pipeline_normalize",
    "pipeline_score",
    "declare_anomaly",
    "declare_normalize",
    "declare_score",
    "run_anomaly",
    "run_pipeline",
    "HANDLERS",
]

READING_DTYPE = np.dtype([("index", "<u8"), ("value", "<f8"), ("slot", "<u4"), ("flush", "<u4")])
"""A reading (the Rust workload's ``ReadingMsg``): its position, value, sensor slot (the key)
and, when not zero, a flush marker."""
ALERT_DTYPE = np.dtype(
    [("index", "<u8"), ("value", "<f8"), ("z", "<f8"), ("slot", "<u4"), ("_pad", "<u4")]
)
"""An alert (``AlertMsg``), or with ``slot == FLUSH`` the answer to a flush marker."""
SENSOR_STATS_DTYPE = np.dtype([("m", "<f8"), ("v", "<f8"), ("n", "<u8")])
"""A sensor's state (``SensorStats``): weighted mean, weighted variance, readings folded."""
RAW_DTYPE = np.dtype([("seq", "<u8"), ("value", "<f8")])
NORMALIZED_DTYPE = np.dtype([("seq", "<u8"), ("x", "<f8")])
SCORED_DTYPE = np.dtype(
    [("seq", "<u8"), ("x", "<f8"), ("score", "<f8"), ("level", "<u4"), ("_pad", "<u4")]
)

FLUSH = 0xFFFFFFFF
ALPHA = 0.01
Z = 4.0
WARMUP = 100


# ---- the handlers, in Python ----------------------------------------------------------------


def anomaly_detect(ks, inp, out, env):  # type: ignore[no-untyped-def]
    """The detector (``anomaly.cu``'s ``anomaly_detect``): scores the reading against its
    sensor's exponentially weighted mean and variance, folds it in, answers an anomaly."""
    if inp.flush != 0:
        out.index = inp.index
        out.value = 0.0
        out.z = 0.0
        out.slot = FLUSH
        out._pad = 0
        return True
    x = inp.value
    n = ks.n
    if n == 0:
        ks.m = x
        ks.v = 0.0
        ks.n = 1
        return False
    m = ks.m
    v = ks.v
    scored = v > 0.0
    z = 0.0
    if scored:
        z = math.fabs(x - m) / math.sqrt(v)
    d = x - m
    ks.m = m + ALPHA * d
    ks.v = (1.0 - ALPHA) * (v + ALPHA * d * d)
    ks.n = n + 1
    alert = scored and z > Z and n >= WARMUP
    if alert:
        out.index = inp.index
        out.value = x
        out.z = z
        out.slot = inp.slot
        out._pad = 0
    return alert


def pipeline_normalize(state, inp, out, env):  # type: ignore[no-untyped-def]
    """The pipeline's first stage (``pipeline.cu``): ``x = clamp(value, 0, 100) / 100``, NaN
    as 0."""
    v = inp.value
    if v != v:
        x = 0.0
    else:
        if v < 0.0:
            v = 0.0
        if v > 100.0:
            v = 100.0
        x = v / 100.0
    out.seq = inp.seq
    out.x = x
    return True


def pipeline_score(state, inp, out, env):  # type: ignore[no-untyped-def]
    """The pipeline's second stage: ``score = x * x``, level 0 below 0.3, 1 below 0.7, else 2."""
    x = inp.x
    s = x * x
    out.seq = inp.seq
    out.x = x
    out.score = s
    if s < 0.3:
        out.level = 0
    elif s < 0.7:
        out.level = 1
    else:
        out.level = 2
    out._pad = 0
    return True


# ---- declaring them, either way ---------------------------------------------------------


def _twin(name: str, wrapper: str) -> str:
    return _resident.workload_cuda_source(name) + "\n" + wrapper


def declare_anomaly(kernel_id: str, sensors: int, lang: str = "numba") -> Any:
    """The detector as a keyed kernel of ``sensors`` keys, its handler in Python (``"numba"``)
    or CUDA C (``"cuda"``: ``anomaly.cu``; CUDA and CudaSim only)."""
    common = dict(
        kernel_id=kernel_id, keys=sensors, in_dtype=READING_DTYPE, out_dtype=ALERT_DTYPE,
        state_dtype=SENSOR_STATS_DTYPE, key_field="slot",
    )
    if lang == "numba":
        return keyed_kernel(numba=anomaly_detect, **common)
    if lang == "cuda":
        return keyed_kernel(
            lambda key, state, msg: None,
            cuda=_resident.workload_cuda_source("anomaly"), function="anomaly_detect", **common,
        )
    raise ValueError(f"lang is 'numba' or 'cuda', got {lang!r}")


def _stage(kernel_id: str, lang: str, func: Callable[..., Any], name: str,
           in_dtype: np.dtype, out_dtype: np.dtype) -> Any:
    if lang == "numba":
        return device_kernel(numba=func, kernel_id=kernel_id, in_dtype=in_dtype,
                             out_dtype=out_dtype)
    if lang == "cuda":
        src = _twin(
            "pipeline",
            f"__device__ bool {name}_c(ResidentState* s, const ResidentIn* in, "
            f"ResidentOut* out, const Envelope* env) {{ return {name}(s, in, out, env); }}\n",
        )
        return device_kernel(lambda state, batch: batch, kernel_id=kernel_id,
                             in_dtype=in_dtype, out_dtype=out_dtype, cuda=src,
                             function=f"{name}_c")
    raise ValueError(f"lang is 'numba' or 'cuda', got {lang!r}")


def declare_normalize(kernel_id: str, lang: str = "numba") -> Any:
    """The pipeline's normalizer as a device kernel (``RAW_DTYPE`` -> ``NORMALIZED_DTYPE``)."""
    return _stage(kernel_id, lang, pipeline_normalize, "pipeline_normalize", RAW_DTYPE,
                  NORMALIZED_DTYPE)


def declare_score(kernel_id: str, lang: str = "numba") -> Any:
    """The pipeline's scorer as a device kernel (``NORMALIZED_DTYPE`` -> ``SCORED_DTYPE``)."""
    return _stage(kernel_id, lang, pipeline_score, "pipeline_score", NORMALIZED_DTYPE,
                  SCORED_DTYPE)


HANDLERS: Dict[str, Tuple[Callable[..., Any], str]] = {
    "anomaly_detect": (anomaly_detect, "keyed"),
    "pipeline_normalize": (pipeline_normalize, "device"),
    "pipeline_score": (pipeline_score, "device"),
}
"""Every ``numba=`` handler this package ships, and its kernel kind (CI links each to sm_90)."""


# ---- running them ------------------------------------------------------------------------


_CHUNK = 1024


def _send(rt: Any, kernel_id: str, records: np.ndarray, got: List[np.ndarray],
          timeout: float) -> None:
    """Sends every record of ``records`` in runs of at most ``_CHUNK`` (the rest of a run
    again when the queue took only some), taking the outputs ready before each run into
    ``got``, so that a full output queue never holds the kernel while this waits for room."""
    end = time.monotonic() + timeout
    at = 0
    while at < len(records):
        got.append(rt.receive_batch(kernel_id, 1 << 16, timeout=0.0))
        try:
            at += rt.send_batch(kernel_id, records[at : at + _CHUNK])
        except SendTimeoutError:
            if time.monotonic() > end:
                raise


def _collect(rt: Any, kernel_id: str, done: Callable[[List[np.ndarray]], bool],
             timeout: float, got: Optional[List[np.ndarray]] = None) -> np.ndarray:
    got = [] if got is None else got
    end = time.monotonic() + timeout
    while not done(got):
        left = end - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"kernel '{kernel_id}': outputs incomplete after {timeout} s")
        got.append(rt.receive_batch(kernel_id, 1 << 16, timeout=min(left, 1.0)))
    return np.concatenate(got) if got else np.zeros(0)


def run_anomaly(rt: Any, kernel_id: str, sensors: int, readings: np.ndarray,
                timeout: float = 60.0) -> Tuple[np.ndarray, np.ndarray]:
    """Sends ``readings`` (``READING_DTYPE``) to the launched, active detector of ``sensors``
    keys, then a flush marker for every key (each answered after its key's readings, whose
    alerts are published with or before it), and returns (every alert, by ``index``; every
    key's final state)."""
    got: List[np.ndarray] = []
    for at in range(0, len(readings), _CHUNK):
        _send(rt, kernel_id, readings[at : at + _CHUNK], got, timeout)
    markers = np.zeros(sensors, READING_DTYPE)
    markers["index"] = np.arange(sensors) + len(readings)
    markers["slot"] = np.arange(sensors)
    markers["flush"] = 1
    _send(rt, kernel_id, markers, got, timeout)

    def flushed(got: List[np.ndarray]) -> bool:
        return sum(int((g["slot"] == FLUSH).sum()) for g in got if len(g)) >= sensors

    out = _collect(rt, kernel_id, flushed, timeout, got).astype(ALERT_DTYPE)
    out = out[out["slot"] != FLUSH]
    return out[np.argsort(out["index"], kind="stable")], rt.snapshot_keys(kernel_id)


def run_pipeline(rt: Any, first: str, second: str, raw: np.ndarray,
                 timeout: float = 60.0) -> np.ndarray:
    """Sends ``raw`` (``RAW_DTYPE``) through the two launched, active stages (the first's
    outputs sent on to the second by the host) and returns the scored records by ``seq``."""
    got: List[np.ndarray] = []
    _send(rt, first, raw, got, timeout)
    normalized = _collect(rt, first, lambda g: sum(map(len, g)) >= len(raw), timeout, got)
    got = []
    _send(rt, second, normalized.astype(NORMALIZED_DTYPE), got, timeout)
    scored = _collect(rt, second, lambda g: sum(map(len, g)) >= len(raw), timeout, got)
    scored = scored.astype(SCORED_DTYPE)
    return scored[np.argsort(scored["seq"], kind="stable")]
