"""Waiting in tests for a condition that another process brings about."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_for(pred: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether ``pred()`` became true within ``timeout`` seconds (polled every 50 ms, and once
    more at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return bool(pred())
