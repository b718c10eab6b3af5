"""The internal interface that `treemod.compat` builds on: its one door into treemod's internals.

The compatibility namespaces (`treemod.compat.*`) adapt other libraries' APIs over treemod. They
import treemod's public names (`treemod`, `treemod.nn`) and, for what the public API does not
offer, this module only: each name below is a building block of treemod's own features that an
adapter re-uses rather than re-implements. Nothing in treemod imports this module, and nothing
here knows of any other library; a name is added here when an adapter needs it, with the reason.
`tests/compat/test_equinox_seam.py` checks that compat imports nothing else of treemod's.

Modules (an adapter's own `Module` base, with its library's class options):

- `ModuleMeta`: the metaclass of `treemod.Module`, for a metaclass that adds class options.
  Its class keywords (`shapecheck=`, `strict_abstract_class_vars=`) are the hooks for rules
  that differ between libraries.
- `module_info`: a module class's `ModuleInfo` record (its fields, abstract variables, ...).
- `check_suspect_value`: the construction-time refusal of a method of the module being built
  stored in its own field (a cycle); an adapter whose methods bind to other types calls it
  for those.
- `TransformedFunction`: the base class of the filtered transforms' wrappers
  (`filter_jit(f)`, ...), for an adapter that treats them as modules.

- `PytreeBoundMethod`: the base class of a method bound to a module as a pytree; the
  transforms and `treemod.debug` treat its instances as Python bound methods (`__self__` is
  traced as a pytree, `__func__` is what it calls).

Trees:

- `IS_ARRAY_TYPE`: type -> whether values of the type are arrays (JAX, NumPy, tracers; not
  `jax.ShapeDtypeStruct`), a cached lookup the transforms use to split arrays from the rest
  (for predicates that must not count abstract arrays).
- `compare_trees`: `tree_equal`'s work, with an option for JAX scalar results.
- `describe_value`: the one format for values in messages.

Errors and settings (an adapter giving its library's error types and environment variables):

- `FilterSpecError` (`filter`/`partition`: a spec leaf that is not a bool or predicate; a
  `TypeError`), `WhereComputedError` (`tree_at`: `where` computed with a leaf; a `TypeError`),
  `NotANodeError` (`tree_at`: `where` returned a non-node; a `ValueError`): the specific
  errors, so that an adapter can re-raise them as the types its library uses.
- `set_default_on_error`: what `error_if(..., on_error="default")` does, from the adapter's
  library's own environment variable (treemod's `TREEMOD_ON_ERROR` still wins).

Checkpoint files (an adapter writing another library's file format with treemod's guarantees):

- `replace_atomically`: write a file and rename it over the path, so a failed write leaves the
  old file intact (what `save` does).
- `check_readable`, `check_writable`, `seekable`: the checks `load`/`save` make on open file
  objects (text mode, closed, wrong mode, pipes), with their messages.
- `CheckpointNotFoundError`: the error for a missing file (a `CheckpointError` and a
  `FileNotFoundError`).
- `spanning_error`: the refusal of arrays whose values live in other processes.

Layers (an adapter's layers built on treemod's, with other signatures, initialisation or
parameter layouts):

- `kernel_spatial_axes`, `to_kernel_layout`: a convolution kernel's spatial axes, and a
  channels-first kernel in a layer's own layout (channels-first or channels-last).
- `apply_image_layer`, `layer_name`: how image layers (pools) accept batches and channels-last
  input, and the layer name their messages use.
- `with_spatial_dims`: an N-d layer's `__init__` with `num_spatial_dims` fixed (for the
  per-dimension classes of an adapter's N-d layers).
- `batch_statistics`, `normalise`: BatchNorm's statistics and normalisation.
- `power_iteration`: SpectralNorm's power-iteration step.
- `default_dtype`, `compute_dtype`, `require_key`, `accepts_key`, `identity`: the layers'
  argument checks (parameter dtype, statistics dtype, a key given), whether a layer's call takes
  `key=`, and `MLP`'s identity activation.
- `promote_input`: the layers' promotion of integer and boolean inputs to floating point (for an
  adapter's layers that compute their own formula, so they take the inputs treemod's take).
"""

from treemod._format.describe import describe_value
from treemod._module.construction import check_suspect_value
from treemod._module.module import ModuleMeta
from treemod._saving.atomic_file import replace_atomically
from treemod._saving.multihost import spanning_error
from treemod._saving.safetensors_read import CheckpointNotFoundError, check_readable, seekable
from treemod._saving.safetensors_write import check_writable
from treemod._transforms.error_if import set_default_on_error
from treemod._transforms.wrapper import PytreeBoundMethod, TransformedFunction
from treemod._tree.filters import IS_ARRAY_TYPE, FilterSpecError
from treemod._tree.module_info import module_info
from treemod._tree.tree_at import NotANodeError, WhereComputedError
from treemod._tree.tree_equal import compare_trees
from treemod.nn._batch_norm import batch_statistics, normalise
from treemod.nn._layout import apply_image_layer, kernel_spatial_axes, layer_name, to_kernel_layout
from treemod.nn._mlp import identity
from treemod.nn._spectral_norm import power_iteration
from treemod.nn._utils import (
    accepts_key,
    compute_dtype,
    default_dtype,
    promote_input,
    require_key,
    with_spatial_dims,
)

__all__ = [
    "IS_ARRAY_TYPE",
    "CheckpointNotFoundError",
    "FilterSpecError",
    "ModuleMeta",
    "NotANodeError",
    "PytreeBoundMethod",
    "TransformedFunction",
    "WhereComputedError",
    "accepts_key",
    "apply_image_layer",
    "batch_statistics",
    "check_readable",
    "check_suspect_value",
    "check_writable",
    "compare_trees",
    "compute_dtype",
    "default_dtype",
    "describe_value",
    "identity",
    "kernel_spatial_axes",
    "layer_name",
    "module_info",
    "normalise",
    "power_iteration",
    "promote_input",
    "replace_atomically",
    "require_key",
    "seekable",
    "set_default_on_error",
    "spanning_error",
    "to_kernel_layout",
    "with_spatial_dims",
]
