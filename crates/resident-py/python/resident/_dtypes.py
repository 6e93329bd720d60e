"""The numpy dtypes a kernel declaration names, read one way for every decorator."""

from typing import Any, Optional, Tuple

import numpy as np


def kernel_dtypes(
    in_dtype: Any, out_dtype: Any = None, state_dtype: Any = None, *, state_required: bool = False
) -> Tuple[np.dtype, np.dtype, Optional[np.dtype]]:
    """``(in, out, state)`` as numpy dtypes: the output is the input's when not given; the
    state is ``None`` when not given, unless the kernel must have one (``state_required``: a
    keyed kernel's state is read as ``np.dtype`` reads it)."""
    i = np.dtype(in_dtype)
    o = i if out_dtype is None else np.dtype(out_dtype)
    s = np.dtype(state_dtype) if (state_dtype is not None or state_required) else None
    return i, o, s
