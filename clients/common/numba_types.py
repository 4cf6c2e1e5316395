"""Types for numba kernels (clients/common/record_validation.py, spark_connector/columnar.py).

numba ships type stubs; where they fall short of what a kernel does, this says it:

- Inside a kernel every integer is an int64, whether it came from a literal or from
  `np.int64(...)`; numpy's stubs tell the two apart. `KernelInt` is either, for the
  annotations of kernel variables and results that mix them (the kernels' code stays as
  numba compiles it fastest).
- numba.core.config sets its settings through `globals()`, out of a type checker's
  sight: `numba_bounds_check` reads NUMBA_BOUNDSCHECK's setting by name.
- `numba.extending.intrinsic` is typed as returning an object called like the typing
  function, `typingctx` first; a kernel calls it without. `void_intrinsic` types it as
  kernels call it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeAlias, cast

import numpy as np
from numba.core import config as numba_config
from numba.extending import intrinsic

KernelInt: TypeAlias = int | np.int64

_P = ParamSpec("_P")


def void_intrinsic(typing: Callable[Concatenate[Any, _P], object]) -> Callable[_P, None]:
    """numba's @intrinsic for an intrinsic returning nothing, typed as a kernel calls it:
    with the typing function's arguments after `typingctx`."""
    return cast("Callable[_P, None]", intrinsic(typing))


def numba_bounds_check() -> bool:
    """Whether numba checks array bounds in kernels (NUMBA_BOUNDSCHECK=1), as numba read it."""
    return bool(vars(numba_config)["BOUNDSCHECK"])
