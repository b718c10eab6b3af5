"""`quantise` and `dequantise`: whole models, by PEFT's `target_modules` rules."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import jax.numpy as jnp

from treemod._module.module import Module
from treemod._tree.module_info import module_info
from treemod._tree.tree_at import tree_at
from treemod.lora._select import Targets, check_targets, matches_target, rewrite_named
from treemod.nn import Linear
from treemod.nn._linear import FanInFanOutLinear

from . import _formats as fmt
from ._layers import (
    Int4Linear,
    Int8Linear,
    NF4Linear,
    QuantLinear,
    layer_fields,
    nf4_unit,
    row_slices,
)

__all__ = ["dequantise", "fan_in_fan_out_as_linear", "quantise"]

Scheme = Literal["int8", "nf4", "fp4", "int4"]
BLOCK_SIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)  # bitsandbytes' `quantize_4bit`'s


def _check_options(scheme: Any, block_size: Any, group_size: Any) -> None:
    if scheme not in ("int8", "nf4", "fp4", "int4"):
        raise ValueError(
            f"quantise: `scheme` must be 'int8', 'nf4', 'fp4' or 'int4'; got {scheme!r}."
        )
    if scheme in ("nf4", "fp4") and block_size not in BLOCK_SIZES:
        raise ValueError(
            f"quantise: `block_size` must be one of {BLOCK_SIZES} (bitsandbytes' block sizes); "
            f"got {block_size!r}."
        )
    if scheme == "int4" and (
        isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 2
    ):
        raise ValueError(f"quantise: `group_size` must be an int >= 2; got {group_size!r}.")


def fan_in_fan_out_as_linear(layer: Any) -> Any:
    """A `FanInFanOutLinear` (GPT-2's `Conv1D`, weight `(in, out)`) as a `Linear`'s fields:
    transformers' bitsandbytes integration quantises the transposed `(out, in)` weight, so the
    packed arrays match its."""
    n_in, n_out = layer.weight.shape
    return SimpleNamespace(
        weight=layer.weight.T, bias=layer.bias, in_features=n_in, out_features=n_out
    )


def _quantised(
    layer: Any, name: str, scheme: str, block_size: int, double_quant: bool, group_size: int
) -> QuantLinear:
    if layer.in_features == "scalar" or layer.out_features == "scalar":
        raise ValueError(f"quantise: the Linear at {name!r} has a scalar input or output.")
    if not jnp.issubdtype(layer.weight.dtype, jnp.floating):
        raise ValueError(
            f"quantise: the Linear at {name!r} has a {layer.weight.dtype} weight; only real "
            "floating-point weights are quantised."
        )
    common = layer_fields(layer)
    n_out, n_in = common["out_features"], common["in_features"]
    w = layer.weight
    if scheme == "int8":
        q, absmax = fmt.quantise_int8(w)
        return Int8Linear(weight=q, absmax=absmax, slices=row_slices(n_out, 1), **common)
    if scheme in ("nf4", "fp4"):
        if (n_out * n_in) % 2:
            raise ValueError(
                f"quantise: the Linear at {name!r} has {n_out}x{n_in} weights, an odd count; "
                f"{scheme.upper()} packs two a byte. Leave it out of target_modules."
            )
        state = fmt.quantise_4bit(w, block_size, double_quant, scheme)
        return NF4Linear(
            weight=state["packed"],
            absmax=state["absmax"],
            nested_absmax=state.get("nested_absmax"),
            offset=state.get("offset"),
            block_size=block_size,
            quant_type=scheme,
            slices=row_slices(n_out, nf4_unit(n_in, block_size)),
            **common,
        )
    if n_in % group_size or group_size % 2:
        raise ValueError(
            f"quantise: the Linear at {name!r} has in_features={n_in}, not a multiple of the "
            f"even group_size={group_size}; pass a group_size that divides it."
        )
    packed, scales, zeros = fmt.quantise_int4(w, group_size)
    return Int4Linear(
        weight=packed,
        scales=scales,
        zeros=zeros,
        group_size=group_size,
        slices=row_slices(n_out, 1),
        **common,
    )


def quantise(
    model: Any,
    target_modules: Targets,
    scheme: Scheme = "nf4",
    *,
    block_size: int = 64,
    double_quant: bool = True,
    group_size: int = 128,
) -> Any:
    """Replace the `Linear` layers that `target_modules` selects with quantised ones.

    Layers are selected exactly as `treemod.lora.add_lora` selects them (PEFT's rules over
    `treemod.state_dict`'s names; a `Stack`'s layers are numbered and quantised one by one).
    GPT-2's `Conv1D` is quantised as the `Linear` it computes (its weight transposed to
    `(out, in)`, as transformers' bitsandbytes integration does; `dequantise` gives the
    `Conv1D` back). The weight is quantised; the bias stays in its float dtype, and the layer
    computes in the weight's original dtype.

    Arguments:
        model: any treemod model.
        target_modules: a list of module names or one regular expression (as `add_lora`).
        scheme: `"int8"`: one scale per output channel (bitsandbytes' LLM.int8 rows);
            `"nf4"`: bitsandbytes' NF4 (blockwise absmax, double quantisation);
            `"fp4"`: bitsandbytes' FP4 (the same, with FP4's 16 levels);
            `"int4"`: asymmetric int4 with a zero point per group (GPTQ's and AWQ's).
        block_size: the 4-bit block size (bitsandbytes' `blocksize`).
        double_quant: quantise the 4-bit absmax values too (bitsandbytes'
            `bnb_4bit_use_double_quant`).
        group_size: the int4 group size along the input.

    Returns:
        The model with `Int8Linear`, `NF4Linear` or `Int4Linear` layers.

    Raises:
        ValueError: nothing matched, a match is not a `Linear`, or an option does not fit a
            layer; the message names the layer.

    Example:
        >>> import jax, jax.numpy as jnp, treemod.nn as nn, treemod.quant as quant
        >>> mlp = nn.Sequential([nn.Linear(64, 64, key=jax.random.key(0))])
        >>> q = quant.quantise(mlp, ["0"], "nf4")
        >>> type(q.layers[0]).__name__, q.layers[0].weight.dtype
        ('NF4Linear', dtype('uint8'))
        >>> x = jnp.ones(64)
        >>> bool(jnp.allclose(q(x), quant.dequantise(q)(x), atol=1e-5))
        True
    """
    _check_options(scheme, block_size, group_size)
    targets = check_targets(target_modules, "quantise")
    found: list[str] = []

    def visit(node: Any, name: str) -> Any:
        if not name or not isinstance(node, Module) or not matches_target(targets, name):
            return None
        if isinstance(node, QuantLinear):
            raise ValueError(f"quantise: the layer at {name!r} is already quantised.")
        if isinstance(node, FanInFanOutLinear):
            node = fan_in_fan_out_as_linear(node)
        elif not isinstance(node, Linear):
            raise ValueError(
                f"quantise: target_modules selects {name!r}, a {type(node).__name__}; only "
                "Linear layers (and GPT-2's Conv1D) are quantised. Narrow target_modules."
            )
        found.append(name)
        return _quantised(node, name, scheme, block_size, double_quant, group_size)

    new = rewrite_named(model, visit, caller="quantise")
    if not found:
        raise ValueError(
            f"quantise: target_modules={target_modules!r} selects no module of the model; "
            "names are treemod.state_dict's without the final `.weight` (e.g. "
            "'model.layers.0.self_attn.q_proj')."
        )
    return new


def dequantise(model: Any) -> Any:
    """Replace every quantised layer with a float `Linear` holding its dequantised weight.

    Arguments:
        model: a model with `Int8Linear`, `NF4Linear` or `Int4Linear` layers (also under LoRA
            adapters).

    Returns:
        The model with `Linear` layers of the original dtype.

    Example:
        >>> import jax, treemod.nn as nn, treemod.quant as quant
        >>> mlp = nn.Sequential([nn.Linear(8, 8, key=jax.random.key(0))])
        >>> back = quant.dequantise(quant.quantise(mlp, ["0"], "int8"))
        >>> type(back.layers[0]).__name__, back.layers[0].weight.dtype
        ('Linear', dtype('float32'))
    """

    replaced: set[str] = set()

    def visit(node: Any, name: str) -> Any:
        if not isinstance(node, QuantLinear):
            return None
        replaced.add(name)
        linear = object.__new__(Linear)
        # Set as unflattening sets fields: the Linear's constructor would draw random weights.
        linear.__dict__.update(
            weight=node.dequantised_weight(),
            bias=node.bias,
            in_features=node.in_features,
            out_features=node.out_features,
            use_bias=node.bias is not None,
        )
        return linear

    new = rewrite_named(model, visit, caller="dequantise")
    if not replaced:
        return new
    return rewrite_named(new, _conv1d_back(replaced), caller="dequantise")


def _conv1d_back(replaced: set[str]) -> Any:
    """A `rewrite_named` visit that turns each dequantised `Linear` in a field declared a
    `FanInFanOutLinear` (GPT-2's `Conv1D`) back into one, so the model computes and saves as
    GPT-2's float checkpoints store it; a LoRA layer there gets PEFT's `fan_in_fan_out`."""

    def to_conv1d(kind: Any, linear: Linear) -> Any:
        return kind(weight=linear.weight.T, bias=linear.bias)

    def visit(node: Any, name: str) -> Any:
        if not isinstance(node, Module):
            return None
        declared = module_info(type(node)).field_annotations
        new = node
        for f, kind in declared.items():
            if not (isinstance(kind, type) and issubclass(kind, FanInFanOutLinear)):
                continue
            value, where = getattr(node, f), f"{name}.{f}" if name else f

            def at(m: Any, f: str = f) -> Any:
                return getattr(m, f)

            if where in replaced and isinstance(value, Linear):
                new = tree_at(at, new, to_conv1d(kind, value))
            elif f"{where}.base_layer" in replaced and isinstance(value.base_layer, Linear):
                adapted = object.__new__(type(value))
                adapted.__dict__.update(
                    vars(value), base_layer=to_conv1d(kind, value.base_layer), fan_in_fan_out=True
                )
                new = tree_at(at, new, adapted)
        # Such a module's other fields hold no quantised layer (GPT-2's: dropouts), so the
        # rewrite need not look below it.
        return None if new is node else new

    return visit
