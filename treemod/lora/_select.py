"""Which layers get adapters: PEFT's `target_modules` rules over the state-dict names."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.tree_util as jtu
import numpy as np
from jaxtyping import PRNGKeyArray

from treemod._module.state import State
from treemod._state_dict.layers import NATIVE_HOOKS
from treemod._state_dict.walk import entries_of, from_entries, is_tensor, join
from treemod._tree.filters import combine, is_array, partition
from treemod._tree.tree_at import tree_at
from treemod.nn import Conv, Linear, Stack
from treemod.nn._linear import FanInFanOutLinear

from ._layers import LoRAConv, LoRALayer, LoRALinear

__all__ = [
    "AdaptedAsLinear",
    "add_lora",
    "check_hyperparameters",
    "check_targets",
    "matches_target",
    "rewrite_named",
    "wrap_targets",
]

Targets = str | Sequence[str]


class AdaptedAsLinear:
    """The contract a layer of a higher package declares, by inheriting this class, to be
    adapted by `add_lora` as a `Linear`: it computes `x @ W.T (+ bias)` with a frozen `W` of
    `(out_features, in_features)` in its `dtype`, and has those three fields (`treemod.quant`'s
    `QuantLinear`: QLoRA). `lora` reads the contract from the class; it never imports the
    package that declares it.
    """

    __slots__ = ()


def _number(value: Any) -> bool:
    return isinstance(value, int | float | np.integer | np.floating) and not isinstance(
        value, bool | np.bool_
    )


def _hint(value: Any) -> str:
    if isinstance(value, bool | np.bool_):
        return " (a bool is not a number here)"
    if isinstance(value, str):
        return " (a str: pass the number itself)"
    return "" if _number(value) else f" (a {type(value).__name__})"


def check_hyperparameters(
    r: Any, alpha: Any, dropout: Any, use_rslora: Any, caller: str = "add_lora"
) -> tuple[int, float, float, bool]:
    """`(r, alpha, dropout, use_rslora)` as plain Python values if each is valid (`r` a
    positive int, `alpha` a finite positive number, `dropout` in [0, 1], `use_rslora` a bool);
    else a `ValueError` naming the argument and the value. An integral `alpha` stays an int
    (PEFT's configs write `lora_alpha: 16`)."""
    if isinstance(r, bool | np.bool_) or not isinstance(r, int | np.integer) or r < 1:
        raise ValueError(f"{caller}: `r` (the rank) must be a positive int; got {r!r}{_hint(r)}.")
    if not (_number(alpha) and 0 < float(alpha) < math.inf):
        raise ValueError(
            f"{caller}: `alpha` (lora_alpha) must be a positive number; got {alpha!r}"
            f"{_hint(alpha)}. The update is scaled by alpha / r."
        )
    if not (_number(dropout) and 0 <= float(dropout) <= 1):
        raise ValueError(
            f"{caller}: `dropout` (lora_dropout) must be in [0, 1]; got {dropout!r}"
            f"{_hint(dropout)}."
        )
    if not isinstance(use_rslora, bool | np.bool_):
        raise ValueError(f"{caller}: `use_rslora` must be a bool; got {use_rslora!r}.")
    plain_alpha = int(alpha) if isinstance(alpha, int | np.integer) else float(alpha)
    return int(r), plain_alpha, float(dropout), bool(use_rslora)


def _check_rank(node: Any, name: str, r: int) -> None:
    if isinstance(node, AdaptedAsLinear):
        layer: Any = node  # the contract's fields (a mixin declares no fields of a Module)
        fan_in, fan_out = int(layer.in_features), int(layer.out_features)
    elif not hasattr(node, "weight") or getattr(node.weight, "ndim", 0) < 2:
        return
    elif isinstance(node, Conv):
        fan_in = int(node.in_channels) * int(np.prod(node.kernel_size))
        fan_out = int(node.out_channels)
    else:
        fan_in, fan_out = int(node.weight.shape[-1]), int(node.weight.shape[-2])
    if r > max(fan_in, fan_out):
        raise ValueError(
            f"add_lora: `r`={r} is above the larger dimension ({max(fan_in, fan_out)}) of the "
            f"layer at {name!r} (fan-in {fan_in}, fan-out {fan_out}); B @ A has rank at most "
            f"{min(fan_in, fan_out)} there, so a larger r only allocates more. Pass a smaller r."
        )


def matches_target(target_modules: Targets, name: str) -> bool:
    """PEFT's rule (`check_target_module_exists`): a string is a regular expression that must
    match the whole name (`re.fullmatch`); a list matches a name equal to one of its entries or
    ending in `.` + an entry.

    Arguments:
        target_modules: a regular expression, or a list of module names.
        name: a module's PyTorch-style name (`model.layers.0.self_attn.q_proj`).

    Returns:
        Whether the module is targeted.

    Example:
        >>> from treemod.lora import matches_target
        >>> matches_target(["q_proj"], "model.layers.0.self_attn.q_proj")
        True
        >>> matches_target(r".*\\.0\\..*proj", "model.layers.1.self_attn.q_proj")
        False
    """
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, name) is not None
    return name in target_modules or any(name.endswith(f".{t}") for t in target_modules)


def check_targets(target_modules: Any, caller: str = "add_lora") -> str | list[str]:
    """`target_modules` as a compiled-checked regular expression or a list of names; else a
    `ValueError` naming `caller` and the value."""
    if isinstance(target_modules, str):
        try:
            re.compile(target_modules)
        except (re.error, RecursionError, OverflowError) as e:
            raise ValueError(
                f"{caller}: `target_modules` {target_modules!r} is not a regular expression "
                f"({e}); pass a valid one, or a list of module names."
            ) from None
        return target_modules
    if isinstance(target_modules, bytes) or not all(isinstance(t, str) for t in target_modules):
        raise ValueError(
            f"{caller}: `target_modules` must be a regular expression (str) or a list of "
            f"module names (str); got {target_modules!r}."
        )
    return list(target_modules)


def _is_leaf(node: Any) -> bool:
    if node is None or is_tensor(node) or isinstance(node, State):
        return True
    leaves = jtu.tree_leaves(node, is_leaf=lambda x: x is not node)
    return len(leaves) == 1 and leaves[0] is node


def _restack(stack: Stack, layers: list[Any]) -> Stack:
    """A `Stack` of rewritten layers (their structure may differ from the old ones')."""
    arrays = [partition(layer, is_array)[0] for layer in layers]
    stacked = jtu.tree_map(lambda *xs: jax.numpy.stack(xs), *arrays)
    static = partition(layers[0], is_array)[1]
    new: Stack = tree_at(lambda s: s.layers, stack, combine(stacked, static))
    return new


def rewrite_named(
    node: Any, visit: Callable[[Any, str], Any], prefix: str = "", caller: str = "add_lora"
) -> Any:
    """`node` with each sub-module for which `visit(module, name)` returns something other
    than `None` replaced by that; names are `treemod.state_dict`'s (a `Stack`'s layers are
    visited one by one as `prefix.0`, `prefix.1`, ... and stacked again). `caller` names the
    public function in the error for a `Stack` rewritten in only some of its layers."""
    new = visit(node, prefix)
    if new is not None:
        return new
    if _is_leaf(node):
        return node
    entries = entries_of(node, NATIVE_HOOKS)
    rewritten = {k: rewrite_named(v, visit, join(prefix, k), caller) for k, v in entries.items()}
    if all(rewritten[k] is v for k, v in entries.items()):
        return node
    if isinstance(node, Stack):
        layers = [rewritten[str(i)] for i in range(len(node))]
        structures = {jtu.tree_structure(partition(x, is_array)[1]) for x in layers}
        if len(structures) > 1:
            where = repr(prefix) if prefix else "the model's root"
            raise ValueError(
                f"{caller}: target_modules selects a layer in some but not all layers of the "
                f"Stack at {where}; a Stack's layers share one structure, so select the same "
                "modules in each (e.g. match by module name rather than by layer index)."
            )
        return _restack(node, layers)
    return from_entries(node, rewritten, NATIVE_HOOKS)


def _lora(x: Any) -> bool:
    return isinstance(x, LoRALayer)


def add_lora(
    model: Any,
    target_modules: Targets,
    r: int,
    alpha: float,
    *,
    dropout: float = 0.0,
    use_rslora: bool = False,
    key: PRNGKeyArray,
) -> Any:
    """Wrap the layers that `target_modules` selects in LoRA adapters (PEFT's `LoraConfig`).

    Names are `treemod.state_dict`'s (PyTorch's): a zoo model's names are `transformers`'
    (`model.layers.0.self_attn.q_proj`), and a `Stack`'s layers are numbered. Each selected
    layer becomes a `LoRALinear` (on a `Linear`, or on GPT-2's `Conv1D` with PEFT's
    `fan_in_fan_out`) or a `LoRAConv` (on a `Conv`); in a `Stack` the adapters' arrays get the
    layer axis. A is kaiming-uniform (a=sqrt(5)), B zero, so the model's outputs are unchanged
    until training moves B. Each adapted layer draws its A from its own key.

    Arguments:
        model: any treemod model.
        target_modules: a list of module names (`["q_proj", "v_proj"]`: a module is selected
            when its name equals an entry or ends in `.` + an entry) or one regular expression
            that must match the whole name, exactly as PEFT's `target_modules`.
        r: the rank.
        alpha: `lora_alpha`; the update is scaled by `alpha / r`.
        dropout: `lora_dropout`, applied to the adapter's input (needs a key at call time).
        use_rslora: scale by `alpha / sqrt(r)` instead (rank-stabilised LoRA).
        key: the PRNG key for the A matrices.

    Returns:
        The model with the selected layers wrapped.

    Raises:
        ValueError: nothing matched, a matched module is not a `Linear`/`Conv`, `r` is not a
            positive int (or exceeds a selected layer's larger dimension), `alpha` is not a
            finite positive number, `dropout` is not in [0, 1], `use_rslora` is not a bool, or
            a `target_modules` string is not a regular expression.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn, treemod.lora as lora
        >>> mlp = nn.Sequential([nn.Linear(4, 8, key=jax.random.key(0)), nn.Lambda(jax.nn.relu),
        ...                      nn.Linear(8, 2, key=jax.random.key(1))])
        >>> tuned = lora.add_lora(mlp, ["0", "2"], r=2, alpha=4, key=jax.random.key(2))
        >>> type(tuned.layers[0]).__name__
        'LoRALinear'
        >>> bool(jnp.allclose(tuned(jnp.ones(4)), mlp(jnp.ones(4))))
        True
    """
    return wrap_targets(
        model, target_modules, r, alpha, dropout=dropout, use_rslora=use_rslora, key=key
    )


def wrap_targets(
    model: Any,
    target_modules: Targets,
    r: int,
    alpha: float,
    *,
    dropout: float,
    use_rslora: bool,
    key: PRNGKeyArray,
    bound_rank: bool = True,
) -> Any:
    """`add_lora`; with `bound_rank=False` a rank above a layer's dimensions is allowed
    (`load_adapter`, whose rank is that of the file's tensors, which it has checked)."""
    r, alpha, dropout, use_rslora = check_hyperparameters(r, alpha, dropout, use_rslora)
    target_modules = check_targets(target_modules)
    found: list[str] = []
    counter = iter(range(1 << 62))

    def visit(node: Any, name: str) -> Any:
        if not name or isinstance(node, LoRALayer) or not matches_target(target_modules, name):
            return None
        if _is_leaf(node):
            return None  # PEFT matches modules; a tensor's name never selects anything
        found.append(name)
        k = jax.random.fold_in(key, next(counter))
        common: dict[str, Any] = dict(r=r, alpha=alpha, dropout=dropout, use_rslora=use_rslora)
        if bound_rank:
            _check_rank(node, name, r)
        if isinstance(node, Linear):
            if node.in_features == "scalar" or node.out_features == "scalar":
                raise ValueError(f"add_lora: the Linear at {name!r} has a scalar input or output.")
            return LoRALinear.wrap(node, key=k, **common)
        if isinstance(node, AdaptedAsLinear):
            return LoRALinear.wrap(node, key=k, **common)  # QLoRA: a frozen quantised base
        if isinstance(node, FanInFanOutLinear):  # GPT-2's Conv1D
            return LoRALinear.wrap(node, fan_in_fan_out=True, key=k, **common)
        if isinstance(node, Conv):
            if node.groups != 1 or node.padding_mode != "ZEROS":
                raise ValueError(
                    f"add_lora: the Conv at {name!r} has groups={node.groups} and padding_mode="
                    f"{node.padding_mode!r}; LoRA convolutions (as PEFT's) need groups=1 and zero "
                    "padding."
                )
            return LoRAConv.wrap(node, key=k, **common)
        raise ValueError(
            f"add_lora: target_modules selects {name!r}, a {type(node).__name__}; LoRA adapts "
            "Linear and Conv layers (and GPT-2's Conv1D). Narrow target_modules (as in PEFT, "
            "a list entry matches a name's last components; a string must match it whole)."
        )

    new = rewrite_named(model, visit)
    # Each adapter records its key path for messages (a Stack's adapters appear once, with
    # the layer axis, so the path is the same for all its layers).
    new = jtu.tree_map_with_path(
        lambda path, x: x.at_path(jtu.keystr(path).lstrip(".")) if _lora(x) else x,
        new,
        is_leaf=_lora,
    )
    if not found:
        raise ValueError(
            f"add_lora: target_modules={target_modules!r} selects no module of the model; "
            "names are treemod.state_dict's without the final `.weight` (e.g. "
            "'model.layers.0.self_attn.q_proj'); list them with treemod.state_dict(model)."
        )
    return new
