"""The internal interface that `treemod.compat` builds on: its one door into treemod's internals.

The compatibility namespaces (`treemod.compat.*`) adapt other libraries' APIs over treemod. They
import treemod's public names (`treemod`, `treemod.nn`) and, for what the public API does not
offer, this module only: each name below is a building block of treemod's own features that an
adapter re-uses rather than re-implements. Nothing in treemod imports this module, and nothing
here knows of any other library; a name is added here when an adapter needs it, with the reason.

Checkpoint files (an adapter writing another library's file format with treemod's guarantees):

- `replace_atomically`: write a file and rename it over the path, so a failed write leaves the
  old file intact (what `save` does).
- `check_readable`, `check_writable`, `seekable`: the checks `load`/`save` make on open file
  objects (text mode, closed, wrong mode, pipes), with their messages.
- `CheckpointNotFoundError`: the error for a missing file (a `CheckpointError` and a
  `FileNotFoundError`).
- `spanning_error`: the refusal of arrays whose values live in other processes.

Errors and settings (an adapter giving its library's error types and environment variables):

- `FilterSpecError` (`filter`/`partition`: a spec leaf that is not a bool or predicate; a
  `TypeError`), `WhereComputedError` (`tree_at`: `where` computed with a leaf; a `TypeError`),
  `NotANodeError` (`tree_at`: `where` returned a non-node; a `ValueError`): the specific
  errors, so that an adapter can re-raise them as the types its library uses.
- `set_default_on_error`: what `error_if(..., on_error="default")` does, from the adapter's
  library's own environment variable (treemod's `TREEMOD_ON_ERROR` still wins).

Trees:

- `IS_ARRAY_TYPE`: type -> whether values of the type are arrays (JAX, NumPy, tracers; not
  `jax.ShapeDtypeStruct`), a cached lookup the transforms use to split arrays from the rest
  (for predicates that must not count abstract arrays).

Layers' parameter layouts (converting a layer's parameters to another library's layout):

- `kernel_spatial_axes`, `to_kernel_layout`: a convolution kernel's spatial axes, and a
  channels-first kernel in a layer's own layout (channels-first or channels-last).
"""

from treemod._saving.atomic_file import replace_atomically
from treemod._saving.multihost import spanning_error
from treemod._saving.safetensors_read import CheckpointNotFoundError, check_readable, seekable
from treemod._saving.safetensors_write import check_writable
from treemod._transforms.error_if import set_default_on_error
from treemod._tree.filters import IS_ARRAY_TYPE, FilterSpecError
from treemod._tree.tree_at import NotANodeError, WhereComputedError
from treemod.nn._layout import kernel_spatial_axes, to_kernel_layout

__all__ = [
    "CheckpointNotFoundError",
    "FilterSpecError",
    "IS_ARRAY_TYPE",
    "NotANodeError",
    "WhereComputedError",
    "check_readable",
    "check_writable",
    "kernel_spatial_axes",
    "replace_atomically",
    "seekable",
    "set_default_on_error",
    "spanning_error",
    "to_kernel_layout",
]
