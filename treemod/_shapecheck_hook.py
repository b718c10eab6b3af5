"""The hook through which construction paths (Module init, `tree_at`) ask for field checks.

It lives at the bottom of the import graph so that both the Module core and the tree utilities
can call it; the shape-checking module installs the real checker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_field_checker: list[Callable[[Any], None]] = []


def install_field_checker(checker: Callable[[Any], None]) -> None:
    """Install the function that checks a freshly built module's fields."""
    _field_checker[:] = [checker]


def check_module_fields(module: Any) -> None:
    """Check `module`'s fields with the installed checker, if any."""
    if _field_checker:
        _field_checker[0](module)
