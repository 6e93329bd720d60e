"""PyDotCompute's ``core.accelerator`` names (the package's own objects)."""

from ..accelerator import Accelerator, DeviceProperties, DeviceType, get_accelerator

__all__ = ["Accelerator", "DeviceProperties", "DeviceType", "get_accelerator"]
