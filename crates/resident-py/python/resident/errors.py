"""Exceptions of ``resident``, one class per typed error of the Rust engine.

Every exception carries ``kernel_id`` (or None) and, where the engine has one, ``detail`` (the
kernel's state, the failure reason, the timed-out operation). A send the engine refused hands
its message back in ``message``: nothing is lost silently.
"""

from __future__ import annotations

import asyncio
from typing import Any, Optional

__all__ = [
    "ResidentError",
    "KernelError",
    "MessageError",
    "MessageSerializationError",
    "MessageDeserializationError",
    "QueueError",
    "QueueTimeoutError",
    "BackendError",
    "ValidationError",
    "BufferNotAllocatedError",
    "NumbaNotAvailableError",
    "KernelNotFoundError",
    "KernelStateError",
    "DuplicateKernelError",
    "KernelNotAcceptingError",
    "KernelFailedError",
    "QueueFullError",
    "KernelTimeoutError",
    "SendTimeoutError",
    "ReceiveTimeoutError",
    "CallTimeoutError",
    "MessageDroppedError",
    "NoReplyError",
    "BackendNotAvailableError",
    "CompilationError",
    "DeviceError",
    "InvalidConfigError",
    "DtypeLayoutError",
    "UnknownArgumentError",
    "BufferStateError",
    "OutOfMemoryError",
    "WorkloadError",
    "DLPackError",
    "DLPackDtypeError",
    "MessageTypeError",
    "KeyOutOfRange",
]

_NO_MESSAGE: Any = object()


class ResidentError(Exception):
    """Base class of every error the engine reports."""

    def __init__(
        self,
        text: str,
        kernel_id: Optional[str] = None,
        detail: Optional[str] = None,
        message: Any = _NO_MESSAGE,
    ) -> None:
        super().__init__(text)
        self.kernel_id = kernel_id
        self.detail = detail
        self._message = message

    @property
    def has_message(self) -> bool:
        """Whether the error hands a refused message back."""
        return self._message is not _NO_MESSAGE

    @property
    def message(self) -> Any:
        """The refused message (the very object that was sent), if any; else None."""
        return None if self._message is _NO_MESSAGE else self._message


class KernelError(ResidentError):
    """Base class of the errors about one kernel: not found, wrong state, failed."""


class MessageError(ResidentError):
    """Base class of the errors about a message: its type, its serialization."""


class MessageSerializationError(MessageError, TypeError):
    """``msg.serialize()`` met a value it cannot encode (``detail`` names the field); the
    cause is chained. Also a ``TypeError``."""


class MessageDeserializationError(MessageError, ValueError):
    """``deserialize`` got bytes that are not a serialized message (or not of this class);
    the cause is chained. Also a ``ValueError``."""


class QueueError(ResidentError):
    """Base class of a kernel queue's refusals: full, or nothing within the timeout."""


class BackendError(ResidentError):
    """Base class of the errors of a backend or its device."""


class ValidationError(ResidentError, ValueError):
    """Base class of the errors about a definition or an argument. Also a ``ValueError``."""


class KernelNotFoundError(KernelError, KeyError):
    """No kernel has this id (never launched, or unknown to the registry)."""

    def __str__(self) -> str:  # KeyError would quote the text
        return str(self.args[0]) if self.args else ""


class KernelStateError(KernelError):
    """The operation is not valid in the kernel's state (``detail`` is the state)."""

    @property
    def state(self) -> Optional[str]:
        return self.detail


class DuplicateKernelError(KernelStateError):
    """A live kernel already has this id."""


class KernelNotAcceptingError(KernelStateError):
    """The kernel is terminating, terminated or failed: the send was refused and its
    message is in ``message``."""


class KernelFailedError(KernelError):
    """The kernel's handler raised (or its loop ended early); ``reason`` says how."""

    @property
    def reason(self) -> Optional[str]:
        return self.detail


class QueueFullError(QueueError):
    """The input lane was full under ``backpressure="reject"``; ``message`` is the refused
    message."""


if asyncio.TimeoutError is TimeoutError:  # Python >= 3.11
    _TIMEOUT_BASES: tuple = (TimeoutError,)
else:  # pragma: no cover - Python 3.9/3.10
    _TIMEOUT_BASES = (TimeoutError, asyncio.TimeoutError)


class KernelTimeoutError(ResidentError, *_TIMEOUT_BASES):  # type: ignore[misc]
    """Nothing happened within the timeout. Also a ``TimeoutError`` and an
    ``asyncio.TimeoutError``."""


class QueueTimeoutError(QueueError, KernelTimeoutError):
    """A send, receive or call found no room or no answer within its timeout (the class of
    the three below). Unlike PyDotCompute's, also a ``TimeoutError`` and an
    ``asyncio.TimeoutError``, so ``asyncio.wait_for``-style handlers catch it."""


class SendTimeoutError(QueueTimeoutError):
    """A send under ``backpressure="block"`` found no room within the block timeout;
    ``message`` is the refused message."""


class ReceiveTimeoutError(QueueTimeoutError):
    """No output arrived within the timeout."""


class CallTimeoutError(QueueTimeoutError):
    """No reply arrived within the timeout (a later reply is counted as dropped)."""


class MessageDroppedError(ResidentError):
    """A ``call``'s request was discarded by the kernel's drop policy."""


class NoReplyError(ResidentError):
    """The handler produced no reply to a ``call``."""


class BackendNotAvailableError(BackendError):
    """The requested backend cannot be used on this machine."""


class CompilationError(ResidentError):
    """A device handler did not compile; the text holds the compiler's log."""


class DeviceError(BackendError):
    """The kernel's device refused an operation."""


class InvalidConfigError(ValidationError):
    """The kernel definition is not usable."""


class DtypeLayoutError(InvalidConfigError, TypeError):
    """A numpy dtype cannot be a device kernel's message or state layout: a field type with
    no device type, a field not where C puts it (build the dtype with ``align=True``), a
    type the handler's language cannot hold (WGSL has no 8- or 16-bit integers). ``detail``
    names the field when one is at fault."""

    @property
    def field(self) -> Optional[str]:
        return self.detail


class UnknownArgumentError(InvalidConfigError, TypeError):
    """A decorator (``@ring_kernel``, ``@batch_kernel``, ``@device_kernel``) got a keyword
    argument it does not know; the text suggests the closest one it knows."""


class BufferStateError(ResidentError):
    """A buffer operation is not valid in its state (e.g. syncing a buffer never written)."""


class BufferNotAllocatedError(BufferStateError, ValueError):
    """The buffer holds no memory: it was released to its pool. Also a ``ValueError``."""


class NumbaNotAvailableError(BackendNotAvailableError, ImportError):
    """``@kernel``/``@gpu_kernel`` need Numba, which is not installed (``pip install
    resident[numba]``). Also an ``ImportError``."""


class OutOfMemoryError(ResidentError, MemoryError):
    """An allocation failed or its size overflows."""


class WorkloadError(ResidentError):
    """A reference workload failed (bad input, a kernel error, a result that did not check)."""


class DLPackError(ResidentError, BufferError):
    """An array cannot cross DLPack as asked (a ``BufferError``, as the Python array API
    standard says): a device the other side cannot reach (a CUDA array without the CUDA
    backend, the device copy of a wgpu buffer), a copy asked of memory this side cannot copy,
    a capsule already consumed, a stream that is not allowed."""


class DLPackDtypeError(DLPackError, TypeError):
    """A dtype DLPack cannot describe (structured/record dtypes, objects, strings,
    non-native byte order), or a DLPack dtype numpy has no type for (bfloat16, vector
    lanes). Also a ``TypeError``."""


class MessageTypeError(MessageError, TypeError):
    """A batch call got something that is not a batch of the kernel's messages: a message
    kernel's ``send_batch``/``ctx.send_batch`` takes a list (or tuple, or other iterable) of
    message objects, not an array of records (those go to a ``@batch_kernel``), a string, a
    mapping or a single object; a message kernel's ``receive_batch`` returns a list and takes
    no ``out=``. Also a ``TypeError``."""


class KeyOutOfRange(ResidentError, IndexError):
    """A keyed kernel (``@keyed_kernel``) does not have the key named: a ``send_batch`` with a
    record whose key field is not below the kernel's ``keys`` (the whole batch is refused,
    nothing is queued), or a ``snapshot_keys`` range outside the keys. ``key`` is the key at
    fault. Also an ``IndexError``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    @property
    def key(self) -> Optional[int]:
        return None if self.detail is None else int(self.detail)
