"""What a non-strict `load_state_dict` left out: `StateDictReport`, `StateDictMismatch`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp

__all__ = ["StateDictMismatch", "StateDictReport", "compare_tensors", "compatible"]


def _describe(shape: tuple[int, ...], dtype: Any) -> str:
    return f"{dtype}[{','.join(map(str, shape))}]"


@dataclasses.dataclass(frozen=True)
class StateDictMismatch:
    """A tensor present in both the state dict and the model that could not be loaded.

    Arguments:
        name: the tensor's PyTorch name (`features.0.weight`).
        expected_shape: the shape the model needs.
        expected_dtype: the dtype the model holds (a NumPy/JAX dtype name, `float32`).
        found_shape: the shape in the state dict.
        found_dtype: the dtype in the state dict.

    Example:
        >>> import treemod as tm
        >>> m = tm.StateDictMismatch("fc.weight", (4, 3), "float32", (3, 4), "float32")
        >>> m.reason
        'fc.weight: found float32[3,4], the model needs float32[4,3]'
    """

    name: str
    expected_shape: tuple[int, ...]
    expected_dtype: str
    found_shape: tuple[int, ...]
    found_dtype: str

    @property
    def reason(self) -> str:
        """One line naming the tensor, what was found and what the model needs."""
        found = _describe(self.found_shape, self.found_dtype)
        needed = _describe(self.expected_shape, self.expected_dtype)
        if self.found_shape == self.expected_shape:
            needed += f" (its {self.expected_dtype} tensor cannot hold {self.found_dtype} values)"
        return f"{self.name}: found {found}, the model needs {needed}"


@dataclasses.dataclass(frozen=True)
class StateDictReport:
    """What `load_state_dict(..., strict=False)` left out; empty when everything loaded.

    Tensors the model needs but the state dict lacks (`missing`) keep the model's values;
    tensors of the wrong shape or of an incompatible dtype kind (`mismatched`) are not loaded
    either; tensors the model has no place for (`unexpected`) are ignored. Names are PyTorch's
    (`features.0.weight`), sorted.

    Arguments:
        missing: names the model needs that the state dict lacks.
        unexpected: names in the state dict the model has no place for.
        mismatched: tensors found under a name the model needs, but of the wrong shape or dtype.
        source: the file read (its path), or `None` for a mapping.

    Example:
        >>> import jax, numpy as np, treemod as tm
        >>> fc = tm.nn.Linear(3, 4, key=jax.random.key(0))
        >>> fc, report = tm.load_state_dict(fc, {"weight": np.ones((4, 3), np.float32)},
        ...                                 strict=False)
        >>> report.missing, report.complete
        (('bias',), False)
    """

    missing: tuple[str, ...] = ()
    unexpected: tuple[str, ...] = ()
    mismatched: tuple[StateDictMismatch, ...] = ()
    source: str | None = None

    @property
    def complete(self) -> bool:
        """Whether every tensor loaded and none was left over."""
        return not (self.missing or self.unexpected or self.mismatched)

    def describe(self) -> str:
        """Every problem, one kind per line (the text of the strict mode's error)."""
        lines = []
        if self.missing:
            lines.append(f"  missing ({len(self.missing)}): {', '.join(self.missing)}")
        if self.unexpected:
            lines.append(f"  unexpected ({len(self.unexpected)}): {', '.join(self.unexpected)}")
        for m in self.mismatched:
            lines.append(f"  mismatched: {m.reason}")
        return "\n".join(lines)


def compatible(found: Any, needed: Any) -> bool:
    """Whether values of dtype `found` may be cast to `needed` without changing their kind
    (floating, integer, bool; a complex tensor takes real or complex values)."""
    for kind in (jnp.floating, jnp.integer, jnp.bool_):
        if jnp.issubdtype(needed, kind):
            return bool(jnp.issubdtype(found, kind))
    if jnp.issubdtype(needed, jnp.complexfloating):
        return bool(jnp.issubdtype(found, jnp.inexact))
    return bool(found == needed)


def compare_tensors(
    expected: Mapping[str, Any],
    found: Mapping[str, tuple[tuple[int, ...], Any]],
    reported_as: Mapping[str, str] | None = None,
) -> tuple[tuple[str, ...], list[StateDictMismatch], list[str]]:
    """The one comparison of what a model needs with what a source holds, for
    `load_state_dict` and `from_pretrained`.

    Arguments:
        expected: `{name: jax.ShapeDtypeStruct}`, the tensors the model needs.
        found: `{name: (shape, dtype)}` of the tensors the source holds under the model's names.
        reported_as: the name to report a mismatch under (a file's own name), where it differs.

    Returns:
        `(missing, mismatched, fits)`: the sorted names the source lacks, the mismatches sorted
        by name, and the names that load.
    """
    reported_as = reported_as or {}
    missing = tuple(sorted(n for n in expected if n not in found))
    mismatched: list[StateDictMismatch] = []
    fits: list[str] = []
    for name, needed in expected.items():
        if name not in found:
            continue
        shape, dtype = found[name]
        if tuple(shape) != tuple(needed.shape) or not compatible(dtype, needed.dtype):
            mismatched.append(
                StateDictMismatch(
                    reported_as.get(name, name),
                    tuple(needed.shape),
                    str(needed.dtype),
                    tuple(shape),
                    str(dtype),
                )
            )
        else:
            fits.append(name)
    mismatched.sort(key=lambda m: m.name)
    return missing, mismatched, fits
