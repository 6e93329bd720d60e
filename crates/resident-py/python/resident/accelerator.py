"""Which backends this machine can use, and their devices (the engine's probe):
``available_backends()``, ``backend_report()`` and ``Accelerator``."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import resident._resident as _resident
from .errors import InvalidConfigError

__all__ = [
    "available_backends",
    "backend_report",
    "Accelerator",
    "DeviceProperties",
    "DeviceType",
    "get_accelerator",
]


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


class DeviceType(enum.Enum):
    """The kind of a device (a backend of the engine)."""

    CPU = "cpu"
    CUDA = "cuda"
    WGPU = "wgpu"
    CUDASIM = "cudasim"


@dataclass(frozen=True)
class DeviceProperties:
    """One device as the engine's probe describes it. ``backend`` is the name a runtime
    takes (``Runtime(backend=...)``); figures the engine does not know are None
    (``warp_size`` off CUDA, the block and grid limits, which the probe does not read)."""

    device_id: int
    device_type: DeviceType
    name: str
    compute_capability: Optional[Tuple[int, int]]
    total_memory: int
    """Bytes (0 when unknown, e.g. host RAM on the CPU backend)."""
    multiprocessor_count: int
    """Parallel units: SMs on CUDA, worker threads on the CPU."""
    max_threads_per_block: int
    max_block_dims: Optional[Tuple[int, int, int]]
    max_grid_dims: Optional[Tuple[int, int, int]]
    warp_size: Optional[int]
    is_available: bool
    backend: str
    ordinal: int

    @property
    def compute_capability_str(self) -> str:
        """``"8.9"``, or ``"N/A"`` off CUDA."""
        cc = self.compute_capability
        return "N/A" if cc is None else f"{cc[0]}.{cc[1]}"

    @property
    def total_memory_gb(self) -> float:
        return self.total_memory / (1 << 30)


class Accelerator:
    """The devices of every backend available here (the engine's probe, read when made):
    ``devices``, ``device_count``, ``cuda_available``, ``current_device`` (the first CUDA
    device when there is one, else the CPU; ``set_device`` picks another) and
    ``get_memory_info``. ``Accelerator()`` probes anew; ``get_accelerator()`` returns one
    made once."""

    def __init__(self) -> None:
        self._report = backend_report()
        devs: List[DeviceProperties] = []
        for r in self._report:
            if not r["available"]:
                continue
            for d in r["devices"]:
                kind = DeviceType(r["name"])
                cc = d["compute_capability"]
                devs.append(
                    DeviceProperties(
                        device_id=len(devs),
                        device_type=kind,
                        name=d["name"],
                        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
                        total_memory=int(d["total_memory"]),
                        multiprocessor_count=int(d["compute_units"]),
                        max_threads_per_block=int(d["max_threads_per_block"]),
                        max_block_dims=None,
                        max_grid_dims=None,
                        warp_size=32 if kind in (DeviceType.CUDA, DeviceType.CUDASIM) else None,
                        is_available=True,
                        backend=r["name"],
                        ordinal=int(d["ordinal"]),
                    )
                )
        self._devices = devs
        cuda = [d.device_id for d in devs if d.device_type is DeviceType.CUDA]
        self._current = cuda[0] if cuda else 0

    @property
    def devices(self) -> List[DeviceProperties]:
        return list(self._devices)

    @property
    def device_count(self) -> int:
        return len(self._devices)

    @property
    def cuda_available(self) -> bool:
        return any(d.device_type is DeviceType.CUDA for d in self._devices)

    @property
    def metal_available(self) -> bool:
        """Always False: resident has no Metal backend (wgpu reaches Metal on macOS)."""
        return False

    @property
    def current_device(self) -> DeviceProperties:
        return self._devices[self._current]

    def get_device(self, device_id: int) -> DeviceProperties:
        return self._devices[self._index(device_id)]

    def set_device(self, device_id: int) -> None:
        """Makes ``device_id`` the current device (``current_device``)."""
        self._current = self._index(device_id)

    def _index(self, device_id: Any) -> int:
        n = len(self._devices)
        if isinstance(device_id, bool) or not isinstance(device_id, int) or not 0 <= device_id < n:
            raise InvalidConfigError(f"device_id must be an int in 0..{n - 1}, got {device_id!r}")
        return device_id

    def synchronize(self) -> None:
        """Nothing to wait for: the engine's own operations complete before they return
        (a kernel's outputs are awaited with ``receive``)."""

    def get_memory_info(self) -> Dict[str, int]:
        """The current device's memory: ``total`` bytes as the probe read it (0 when unknown),
        ``free`` and ``used`` 0 (not read by the probe)."""
        return {"total": self.current_device.total_memory, "free": 0, "used": 0}

    def __repr__(self) -> str:
        names = ", ".join(f"{d.backend}:{d.name}" for d in self._devices)
        return f"Accelerator(current={self.current_device.name!r}, devices=[{names}])"


_accelerator: Optional[Accelerator] = None


def get_accelerator() -> Accelerator:
    """One ``Accelerator`` for the process, made (probed) on first use."""
    global _accelerator
    if _accelerator is None:
        _accelerator = Accelerator()
    return _accelerator
