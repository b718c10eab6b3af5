"""Equinox's deprecated `static_field`, for programs that still use it."""

from __future__ import annotations

import warnings
from typing import Any

from treemod import field

__all__ = ["static_field"]


def static_field(**kwargs: Any) -> Any:
    """`field(static=True, **kwargs)`, with Equinox's deprecation warning.

    Example:
        >>> import warnings
        >>> import treemod.compat.equinox as eqx
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("ignore")
        ...     f = eqx.static_field(default=3)
        >>> f.metadata["static"], f.default
        (True, 3)
    """
    warnings.warn(
        "`static_field` is deprecated in Equinox in favour of `field(static=True)`; use that.",
        DeprecationWarning,
        stacklevel=2,
    )
    return field(static=True, **kwargs)
