"""Functions that misbehave on purpose, for the harness's own tests."""

from __future__ import annotations

import os
from typing import Any


def exit_without_result() -> dict[str, Any]:
    """Leave with status 0 before returning (so no result is written)."""
    print("leaving early", flush=True)
    os._exit(0)
