"""ast.parse for the tests that read the project's own source, proof against a CPython 3.11 bug.

CPython 3.11 (before 3.11.8) shares the AST constructor's recursion counter between threads,
so an ast.parse while another thread of the test process compiles (a leftover executor
thread, a dataclass being created on import) can fail with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905; seen once in a CI run). The parse itself is
correct: retrying it is.
"""

from __future__ import annotations

import ast

# A parse hit by the race is retried this many times: the race needs another thread compiling
# at that very moment, so two in a row are already rare.
PARSE_ATTEMPTS = 5


def parse_python(source: str, filename: str = "<unknown>") -> ast.Module:
    """ast.parse(source, filename), retried when CPython 3.11's cross-thread counter misfires."""
    for attempt in range(PARSE_ATTEMPTS):
        try:
            return ast.parse(source, filename=filename)
        except SystemError as error:
            if "recursion depth mismatch" not in str(error) or attempt == PARSE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable: the loop returns or raises")
