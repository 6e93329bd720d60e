"""PyDotCompute's ``ring_kernels.message`` names (the package's own objects)."""

from ..message import RingKernelMessage, deserialize_message, get_message_type, message

__all__ = ["RingKernelMessage", "message", "get_message_type", "deserialize_message"]
