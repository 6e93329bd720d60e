"""The exception classes under the module name PyDotCompute programs import them from
(``from resident.exceptions import QueueFullError``), with PyDotCompute's other names for
some of them. Every class is defined in ``resident.errors``; these are the same objects."""

from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .errors import (
    BufferStateError,
    CompilationError,
    DeviceError,
    DuplicateKernelError,
    InvalidConfigError,
    ResidentError,
)

PyDotComputeError = ResidentError
KernelAlreadyExistsError = DuplicateKernelError
KernelCompilationError = CompilationError
InvalidConfigurationError = InvalidConfigError
CUDAError = DeviceError
# PyDotCompute's names of the buffer errors (``BufferError`` shadows the builtin in a module
# that imports it by name, as it does in PyDotCompute; ``resident`` itself does not export it).
BufferError = BufferStateError  # noqa: A001
BufferSyncError = BufferStateError

__all__ = [
    *_errors_all,
    "PyDotComputeError",
    "KernelAlreadyExistsError",
    "KernelCompilationError",
    "InvalidConfigurationError",
    "CUDAError",
    "BufferError",
    "BufferSyncError",
]
