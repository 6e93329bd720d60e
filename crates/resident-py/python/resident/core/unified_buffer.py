"""PyDotCompute's ``core.unified_buffer`` names (the package's own objects)."""

from ..memory import BufferState, UnifiedBuffer

__all__ = ["UnifiedBuffer", "BufferState"]
