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
- numba's `_nrt` option (compile without its reference-counting runtime) is missing from
  njit's stubs: `njit_without_refcounts` sets it and keeps the kernel's own type.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar, cast

import numpy as np
from numba import njit
from numba.core import config as numba_config
from numba.extending import intrinsic

KernelInt: TypeAlias = int | np.int64

_P = ParamSpec("_P")
_F = TypeVar("_F", bound=Callable[..., object])


def njit_without_refcounts(kernel: _F) -> _F:
    """njit(cache=True, nogil=True) without numba's reference-counting runtime (_nrt=False).

    For kernels that allocate nothing and whose caller holds every array for the whole
    call: numba otherwise passes an array to each inlined helper through an atomic
    increment and decrement it cannot always prune, which can cost more than the work
    (spark_connector/columnar.py says how much). An allocation in such a kernel fails to
    compile rather than leak.
    """
    untyped_njit: Callable[..., Callable[[_F], object]] = njit  # the stubs lack _nrt
    return cast("_F", untyped_njit(cache=True, nogil=True, _nrt=False)(kernel))


def njit_without_refcounts_for(signature: object) -> Callable[[_F], _F]:
    """njit_without_refcounts compiled eagerly for `signature` (at import, so at start-up)."""
    untyped_njit: Callable[..., Callable[[_F], object]] = njit  # the stubs lack _nrt

    def compile_kernel(kernel: _F) -> _F:
        return cast("_F", untyped_njit(signature, cache=True, nogil=True, _nrt=False)(kernel))

    return compile_kernel


def void_intrinsic(typing: Callable[Concatenate[Any, _P], object]) -> Callable[_P, None]:
    """numba's @intrinsic for an intrinsic returning nothing, typed as a kernel calls it:
    with the typing function's arguments after `typingctx`."""
    return cast("Callable[_P, None]", intrinsic(typing))


def numba_bounds_check() -> bool:
    """Whether numba checks array bounds in kernels (NUMBA_BOUNDSCHECK=1), as numba read it."""
    return bool(vars(numba_config)["BOUNDSCHECK"])
