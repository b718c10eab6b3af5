"""The runtime type checkers behind shape checks (typeguard 2.13, beartype), both optional.

Plain jaxtyping array annotations (`Float[Array, "n"]`) are checked with jaxtyping's own
machinery and need neither. An annotation that contains them (`tuple[Float[...], ...]`,
`PyTree[...]`, a list or dict of arrays) goes through a runtime type checker: the one chosen
with `shape_checks(checker=...)` or `TREEMOD_SHAPE_CHECKER`, or by default (`AUTO`) typeguard
2.13 if it is installed and works, else beartype if it is, else none. With none, checking such
an annotation raises `ImportError` saying what to install: it never passes unchecked.

A checker is verified once, before its first use, on a known-bad value (typeguard 3 and 4, for
one, check nothing for jaxtyping annotations); one that fails is refused with `ImportError`.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["AUTO", "BACKENDS", "CHECKERS", "INSTALL", "ensure_checker", "probe"]

CHECKERS = ("typeguard", "beartype")
# The default setting: the first of `CHECKERS` that is installed and works, or none.
AUTO = "auto"
TYPEGUARD_PIN = "pip install 'typeguard>=2.13.3,<3'"
INSTALL = (
    f"install typeguard 2.13 (pip install 'treemod[typeguard]', or {TYPEGUARD_PIN}) or "
    "beartype (pip install beartype)"
)


# Each backend is `check(name, value, annotation) -> ""` (passes) or a reason string.


def _typeguard_check(name: str, value: Any, annotation: Any) -> str:
    import typeguard

    try:
        typeguard.check_type(name, value, annotation)
    except TypeError as e:
        return str(e)
    return ""


def _beartype_check(name: str, value: Any, annotation: Any) -> str:
    from beartype.door import die_if_unbearable
    from beartype.roar import BeartypeException

    try:
        die_if_unbearable(value, annotation)
    except BeartypeException as e:
        return str(e).split("\n")[0]
    return ""


def _typeguard_version() -> str:
    return importlib.metadata.version("typeguard")


def _beartype_version() -> str:
    return importlib.metadata.version("beartype")


BACKENDS: dict[str, Callable[[str, Any, Any], str]] = {
    "typeguard": _typeguard_check,
    "beartype": _beartype_check,
}
_VERSIONS: dict[str, Callable[[], str]] = {
    "typeguard": _typeguard_version,
    "beartype": _beartype_version,
}
# setting ("typeguard", "beartype", AUTO) -> the verified backend that serves it (None: none).
_RESOLVED: dict[str, str | None] = {}


def probe(check: Callable[[str, Any, Any], str]) -> bool:
    """Whether `check` passes a known-good value and catches a known-bad one (mismatched
    dimensions inside a tuple)."""
    # Imported here, not at import treemod (see README.md, "Loading jaxtyping when needed").
    from jaxtyping import Float

    from treemod._private_apis import pop_shape_memo, push_shape_memo

    annotation = tuple[Float[np.ndarray, "n"], Float[np.ndarray, "n"]]  # noqa: F821
    good = (np.zeros(2, np.float32), np.zeros(2, np.float32))
    bad = (np.zeros(2, np.float32), np.zeros(3, np.float32))
    results = []
    for value in (good, bad):
        push_shape_memo({})
        try:
            results.append(check("probe", value, annotation))
        except Exception as e:  # a checker with another API raises on both
            results.append(f"{type(e).__name__}: {e}")
        finally:
            pop_shape_memo()
    return results[0] == "" and results[1] != ""


def _refusal(checker: str) -> str | None:
    """Why the installed `checker` cannot be used (`None`: it can)."""
    try:
        version = _VERSIONS[checker]()
    except importlib.metadata.PackageNotFoundError:
        what = TYPEGUARD_PIN if checker == "typeguard" else "pip install beartype"
        return f"Shape checks use {checker}, which is not installed: {what}"
    if checker == "typeguard" and not version.startswith("2."):
        return (
            f"typeguard {version} is installed, but typeguard 3 and 4 check nothing for "
            f"jaxtyping annotations, so shape checks would silently pass. Install typeguard "
            f"2.13: {TYPEGUARD_PIN}; or use beartype: "
            "treemod.shape_checks(True, checker='beartype') (or TREEMOD_SHAPE_CHECKER=beartype)"
        )
    if not probe(BACKENDS[checker]):
        return (
            f"The installed {checker} {version} does not catch a known-bad jaxtyping value "
            f"(a tuple of f32[2] and f32[3] annotated tuple[Float[ndarray, 'n'], "
            f"Float[ndarray, 'n']]), so shape checks would silently pass. Install "
            f"typeguard 2.13 ({TYPEGUARD_PIN}) or a recent beartype (pip install -U "
            "beartype) and choose it with treemod.shape_checks(True, checker=...)"
        )
    return None


def ensure_checker(checker: str) -> str | None:
    """The verified backend for the setting `checker`; worked out once per setting.

    Arguments:
        checker: `"typeguard"`, `"beartype"` or `AUTO`.

    Returns:
        The backend's name (a key of `BACKENDS`), or `None` for `AUTO` when no checker is
        installed and working.

    Raises:
        ImportError: `checker` was chosen by name and is missing, the wrong version, or
            checks nothing.
    """
    try:
        return _RESOLVED[checker]
    except KeyError:
        pass
    if checker == AUTO:
        resolved = next((c for c in CHECKERS if _refusal(c) is None), None)
    else:
        reason = _refusal(checker)
        if reason is not None:
            raise ImportError(
                f"{reason}. Or turn shape checks off: treemod.shape_checks(False) or "
                "TREEMOD_SHAPE_CHECKS=0."
            )
        resolved = checker
    _RESOLVED[checker] = resolved
    return resolved
