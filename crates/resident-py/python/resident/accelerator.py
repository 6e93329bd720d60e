"""Which backends this machine can use, and their devices (the engine's probe)."""

from __future__ import annotations

from typing import Any, Dict, List

import resident._resident as _resident

__all__ = ["available_backends", "backend_report"]


def backend_report() -> List[Dict[str, Any]]:
    """Every backend the engine knows (``cpu``, ``cuda``, ``wgpu``, ``cudasim``, in that
    order), probed now: one dict each with ``name``, ``available``, ``reason`` (why not, or
    None), ``nvrtc`` (CUDA: whether runtime compilation loads; else None) and ``devices``
    (one dict of properties per device: ``name``, ``ordinal``, ``compute_units``,
    ``total_memory``, ``max_threads_per_block``, ``compute_capability``, ...)."""
    return _resident.probe_backends()


def available_backends() -> List[str]:
    """The backends a runtime can use here (``Runtime(backend=name)``), in the engine's order:
    ``cpu`` always, then those of ``cuda``, ``wgpu``, ``cudasim`` that open."""
    return [r["name"] for r in backend_report() if r["available"]]
