"""Fixtures of the simulation tests."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _quiet_service_logs() -> Iterator[None]:
    """The services log every failover at WARNING; in a simulation those are the point, not news."""
    logger = logging.getLogger("highwater")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    yield
    logger.setLevel(level)
