"""treemod: pytree-native neural-network modules for JAX.

Each section below belongs to one area of the library; keep names sorted within a section and
list every name in `__all__`.
"""

# Filters and tree utilities.
from treemod._tree.filters import (
    combine,
    filter,
    is_array,
    is_array_like,
    is_inexact_array,
    is_inexact_array_like,
    partition,
)
from treemod._format.pretty import tree_pformat, tree_pprint, tree_summary
from treemod._tree.apply_updates import apply_updates
from treemod._tree.tree_at import tree_at
from treemod._tree.tree_equal import tree_equal
from treemod._tree.check import tree_check, tree_flatten_one_level

# The Module core.
from treemod._module.abstract import AbstractClassVar, AbstractVar
from treemod._module.module import FrozenModuleError, Module, field
from treemod._module.partial import Partial
from treemod._enumeration import Enumeration
from treemod._display.hook import treescope_repr as _treescope_repr
from treemod._display.summary import ModelSummary, summary

# State.
from treemod._module.state import State, is_param, is_state, stateful, update_state

# Transforms (filter_jit and friends).
from . import debug as debug
from treemod._transforms.derivatives import (
    filter_grad,
    filter_hessian,
    filter_jacfwd,
    filter_jacrev,
    filter_value_and_grad,
)
from treemod._transforms.jvp_vjp import filter_jvp, filter_vjp
from treemod._transforms.pure_callback import filter_pure_callback
from treemod._transforms.remat import filter_checkpoint
from treemod._transforms.aot import LoadedCompiled, load_compiled, save_compiled
from treemod._transforms.compile_cache import enable_compile_cache
from treemod._transforms.custom_jvp import filter_custom_jvp
from treemod._transforms.custom_vjp import filter_custom_vjp
from treemod._transforms.error_if import RuntimeCheckError, branched_error_if, error_if
from treemod._transforms.eval_shape import filter_eval_shape
from treemod._transforms.jit import JitWrapped, filter_jit
from treemod._transforms.compile_once import compile_once
from treemod._transforms.make_jaxpr import filter_make_jaxpr
from treemod._transforms.shard import filter_shard
from treemod._transforms.pmap import filter_pmap
from treemod._transforms.closure_convert import filter_closure_convert
from treemod._transforms.caches import clear_caches
from treemod._transforms.axis_specs import if_array
from treemod._transforms.vmap import filter_vmap
from treemod._transforms.shard_map import filter_shard_map

# Sharding by logical axis names.
from treemod._sharding.axes import axis_names, logical_axes
from treemod._sharding.rules import (
    ShardingError,
    fsdp_rules,
    fsdp_tp_rules,
    tensor_parallel_rules,
)
from treemod._sharding.place import model_shardings, shard
from treemod._sharding.init import sharded_init
from treemod._sharding.constrain import axis_rules, constrain

# Shape checks. `ShapeCheckError` is made at its first lookup (it subclasses jaxtyping's error,
# and jaxtyping is imported only when shape checks first need it): see `__getattr__` below.
from treemod._shapecheck.checker import shapecheck
from treemod._shapecheck.config import (
    shape_checks,
    shape_checks_enabled,
)

# Serialisation.
from treemod._saving.errors import CheckpointError
from treemod._saving.checkpoint import load, save

# PyTorch-named state dicts. They name `treemod.nn`'s layers, which their functions import at
# their first call (see treemod/_state_dict/README.md).
from treemod._state_dict.api import load_state_dict, state_dict
from treemod._state_dict.hooks import register_state_dict_hooks
from treemod._state_dict.report import StateDictMismatch, StateDictReport

# The layers live in `treemod.nn`, importable as `tm.nn` after `import treemod as tm`. It is
# imported at the first `tm.nn` (a third of `import treemod`'s time), not here; likewise
# `ShapeCheckError` (with jaxtyping, half of what remained) at its first lookup (PEP 562).
import typing as _typing

if _typing.TYPE_CHECKING:
    __version__: str
    from . import lora as lora
    from . import models as models
    from . import nn as nn
    from . import precision as precision
    from . import quant as quant
    from treemod._shapecheck.checker import ShapeCheckError as ShapeCheckError

# treescope's extension hook: treescope calls it on any module, whichever of the two was
# imported first; the renderer (treemod/_display/treescope_view.py) loads at the first render.
Module.__treescope_repr__ = _treescope_repr  # type: ignore[attr-defined]


# Subpackages loaded at their first use as attributes (`tm.nn.Linear`, `tm.models.GPT2Model`).
_LAZY_SUBPACKAGES = ("nn", "models", "lora", "precision", "quant")


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY_SUBPACKAGES:
        import importlib

        return importlib.import_module(f"treemod.{name}")
    if name == "ShapeCheckError":
        from treemod._shapecheck import checker

        error = globals()[name] = checker.ShapeCheckError
        return error
    if name == "__version__":
        return _version()
    raise AttributeError(f"module 'treemod' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_SUBPACKAGES, "ShapeCheckError", "__version__"})


def _version() -> str:
    """The installed distribution's version (written once, in pyproject.toml), read at the first
    `treemod.__version__`: the lookup scans `sys.path` (tens of milliseconds at import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("treemod")
    except PackageNotFoundError:  # a source tree on sys.path, never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found


__all__ = [
    # Filters and tree utilities.
    "apply_updates",
    "combine",
    "filter",
    "is_array",
    "is_array_like",
    "is_inexact_array",
    "is_inexact_array_like",
    "partition",
    "tree_at",
    "tree_check",
    "tree_equal",
    "tree_flatten_one_level",
    "tree_pformat",
    "tree_pprint",
    "tree_summary",
    "ModelSummary",
    "summary",
    # The Module core.
    "AbstractClassVar",
    "AbstractVar",
    "Enumeration",
    "FrozenModuleError",
    "Module",
    "Partial",
    "field",
    # State.
    "State",
    "is_param",
    "is_state",
    "stateful",
    "update_state",
    # Transforms.
    "JitWrapped",
    "LoadedCompiled",
    "RuntimeCheckError",
    "branched_error_if",
    "clear_caches",
    "enable_compile_cache",
    "error_if",
    "filter_checkpoint",
    "filter_closure_convert",
    "filter_custom_jvp",
    "filter_custom_vjp",
    "filter_eval_shape",
    "filter_grad",
    "filter_hessian",
    "filter_jacfwd",
    "filter_jacrev",
    "filter_jit",
    "compile_once",
    "filter_jvp",
    "filter_make_jaxpr",
    "filter_pmap",
    "filter_pure_callback",
    "filter_shard",
    "filter_shard_map",
    "filter_value_and_grad",
    "filter_vjp",
    "filter_vmap",
    "if_array",
    "load_compiled",
    "save_compiled",
    # Sharding.
    "ShardingError",
    "axis_names",
    "axis_rules",
    "constrain",
    "fsdp_rules",
    "fsdp_tp_rules",
    "logical_axes",
    "model_shardings",
    "shard",
    "sharded_init",
    "tensor_parallel_rules",
    # Shape checks.
    "ShapeCheckError",
    "shape_checks",
    "shape_checks_enabled",
    "shapecheck",
    # Serialisation.
    "CheckpointError",
    "load",
    "save",
    # PyTorch-named state dicts.
    "StateDictMismatch",
    "StateDictReport",
    "load_state_dict",
    "register_state_dict_hooks",
    "state_dict",
]
