"""Quantised Hugging Face checkpoints in and out: what `from_pretrained` and `save_pretrained`
call when a `config.json` has a `quantization_config` or a model holds quantised layers.

Loading reads the stored arrays into treemod's quantised layers as they are (no dequantising):
the float model's selected `Linear`s become quantised layers of the stored shapes, and the
checkpoint is shown to the loader under those layers' field names (`hub_loader`). Saving
renames the layers' arrays to what `transformers` writes and gives the `quantization_config`
(`hub_save`). The formats: `_hub_bitsandbytes.py`, `_gptq.py` (int4 layers are saved as GPTQ),
`_awq.py`, `_compressed_tensors.py`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from treemod._module.module import Module
from treemod._saving.errors import CheckpointError
from treemod.lora._select import rewrite_named
from treemod.nn import Linear
from treemod.nn._linear import FanInFanOutLinear

from ._awq import awq_config, awq_layers, awq_skeleton_layer
from ._compressed_tensors import packed_config, packed_layers, packed_skeleton_layer
from ._gptq import gptq_config, gptq_from_int4, gptq_layers, gptq_skeleton_layer
from ._hub_bitsandbytes import (
    bnb_config,
    bnb_layers,
    bnb_quant_type,
    bnb_saved,
    bnb_skeleton_layer,
    bnb_view,
)
from ._layers import Int8Linear, NF4Linear, QuantLinear
from ._quantise import fan_in_fan_out_as_linear

__all__ = ["hub_loader", "hub_save", "quantised_layers"]

C = TypeVar("C")
SUPPORTED = (
    "'bitsandbytes' (load_in_4bit with bnb_4bit_quant_type='nf4' or 'fp4', or load_in_8bit) "
    "and 'gptq' (bits=4, checkpoint_format='gptq' or 'gptq_v2') and 'compressed-tensors' "
    "(format='pack-quantized', int4 or int8 weights) and 'awq' (bits=4, version='gemm')"
)


class _WithValues:
    """Mixed into a checkpoint's class: tensors whose values live in JSON states, not files."""

    hub_values: dict[str, np.ndarray]

    def read_into(self, name: str, index: Sequence[slice], out: np.ndarray) -> None:
        value = self.hub_values.get(name)
        if value is None:
            super().read_into(name, index, out)  # type: ignore[misc]
        else:
            out[...] = value[tuple(index)]


def hub_loader(qconfig: Any, checkpoint: C, where: str) -> tuple[Callable[[Any], Any], C]:
    """What loading a quantised checkpoint needs: the model rewrite and the checkpoint view.

    Arguments:
        qconfig: `config.json`'s `quantization_config`.
        checkpoint: the checkpoint's tensors (`tensors` by name, `read(name)`, `read_into`).
        where: `config.json`'s path, for messages.

    Returns:
        `(convert, view)`: `convert(model)` replaces the float model's stored-quantised
        `Linear`s with quantised layers of the stored shapes (zeros; run it inside the
        shape-only build); `view` is the checkpoint with those layers' tensors under treemod's
        field names.

    Raises:
        CheckpointError: a `quant_method` or option treemod does not read, naming it, the file
            and what is read.
    """
    method = qconfig.get("quant_method") if isinstance(qconfig, dict) else None
    if method == "gptq":
        return _gptq_loader(qconfig, checkpoint, where)
    if method == "compressed-tensors":
        return _packed_loader(qconfig, checkpoint, where)
    if method == "awq":
        return _awq_loader(qconfig, checkpoint, where)
    if method != "bitsandbytes":
        raise CheckpointError(
            f"{where}: quantization_config.quant_method={method!r} is not read; treemod reads "
            f"{SUPPORTED} checkpoints. Dequantise the checkpoint with its library first."
        )
    kind = bnb_config(qconfig, where)
    tensors: Mapping[str, Any] = checkpoint.tensors  # type: ignore[attr-defined]
    layers = bnb_layers(kind, tensors, checkpoint.read, where)  # type: ignore[attr-defined]
    if not layers:
        raise CheckpointError(
            f"{where}: quantization_config says {kind} but the weights hold no quantised layer "
            "(no bitsandbytes state tensors)."
        )
    renamed, values = bnb_view(tensors, layers, dataclasses.replace)
    # The checkpoint's own class with `_WithValues` in front: its reads of file tensors as they
    # are, the JSON states' values from `values` (the class is not imported: models is above).
    cls = type(f"Hub{type(checkpoint).__name__}", (_WithValues, type(checkpoint)), {})
    view: Any = object.__new__(cls)
    view.__dict__.update(vars(checkpoint), tensors=renamed, hub_values=values)

    def convert(model: Any) -> Any:
        def make(node: Any, name: str) -> Any:
            return bnb_skeleton_layer(node, layers[name], where)

        return _replace_layers(model, set(layers), make, where)

    return convert, view


def _replace_layers(
    model: Any, names: set[str], make: Callable[[Any, str], Any], where: str
) -> Any:
    """`model` with the `Linear` (or GPT-2's `Conv1D`, as the `Linear` it computes) at each of
    `names` replaced by `make(linear, name)`."""
    found: set[str] = set()

    def visit(node: Any, name: str) -> Any:
        if name not in names or not isinstance(node, Module):
            return None
        if isinstance(node, FanInFanOutLinear):
            node = fan_in_fan_out_as_linear(node)  # transformers quantises it transposed
        elif not isinstance(node, Linear):
            raise CheckpointError(
                f"{where}: the weights hold {name} quantised, but the model's {name} is a "
                f"{type(node).__name__}, not a Linear."
            )
        found.add(name)
        return make(node, name)

    new = rewrite_named(model, visit, caller="from_pretrained")
    if len(found) < len(names):
        lost = sorted(names - found)
        raise CheckpointError(
            f"{where}: the weights hold quantised layers the model does not have "
            f"({', '.join(lost[:4])}{' ...' if len(lost) > 4 else ''})."
        )
    return new


def _gptq_loader(qconfig: Any, checkpoint: C, where: str) -> tuple[Callable[[Any], Any], C]:
    """`hub_loader` for GPTQ: the layers' fields are the file's names, so no view is needed."""
    _, zero_offset = gptq_config(qconfig, where)
    layers = gptq_layers(checkpoint.tensors)  # type: ignore[attr-defined]
    if not layers:
        raise CheckpointError(
            f"{where}: quantization_config says gptq but the weights hold no qweight tensor."
        )

    def convert(model: Any) -> Any:
        def make(node: Any, name: str) -> Any:
            return gptq_skeleton_layer(node, name, layers[name], zero_offset, where)

        return _replace_layers(model, set(layers), make, where)

    return convert, checkpoint


def _awq_loader(qconfig: Any, checkpoint: C, where: str) -> tuple[Callable[[Any], Any], C]:
    """`hub_loader` for AWQ: the layers' fields are the file's names."""
    group = awq_config(qconfig, where)
    layers = awq_layers(checkpoint.tensors)  # type: ignore[attr-defined]
    if not layers:
        raise CheckpointError(
            f"{where}: quantization_config says awq but the weights hold no qweight tensor."
        )

    def convert(model: Any) -> Any:
        def make(node: Any, name: str) -> Any:
            return awq_skeleton_layer(node, name, group, where)

        return _replace_layers(model, set(layers), make, where)

    return convert, checkpoint


def _packed_loader(qconfig: Any, checkpoint: C, where: str) -> tuple[Callable[[Any], Any], C]:
    """`hub_loader` for compressed-tensors: the layers' fields are the file's names."""
    options = packed_config(qconfig, where)
    tensors = checkpoint.tensors  # type: ignore[attr-defined]
    layers = packed_layers(tensors)
    if not layers:
        raise CheckpointError(
            f"{where}: quantization_config says compressed-tensors but the weights hold no "
            "weight_packed tensor."
        )

    def convert(model: Any) -> Any:
        def make(node: Any, name: str) -> Any:
            dtype = tensors[f"{name}.weight_scale"].dtype
            return packed_skeleton_layer(node, name, options, layers[name], dtype, where)

        return _replace_layers(model, set(layers), make, where)

    return convert, checkpoint


def quantised_layers(model: Any) -> dict[str, QuantLinear]:
    """Every quantised layer of `model` by its `treemod.state_dict` name (a `Stack`'s layers
    one by one)."""
    found: dict[str, QuantLinear] = {}

    def visit(node: Any, name: str) -> Any:
        if isinstance(node, QuantLinear):
            found[name] = node
        return None

    rewrite_named(model, visit, caller="save_pretrained")
    return found


def _floats(model: Any) -> list[str]:
    """The float layers transformers' bitsandbytes integration would quantise: `Linear`s and
    GPT-2's `Conv1D`s."""
    out: list[str] = []
    kinds = (Linear, FanInFanOutLinear)

    def visit(node: Any, name: str) -> Any:
        if isinstance(node, kinds) and name:
            out.append(name)
        return None

    rewrite_named(model, visit, caller="save_pretrained")
    return out


def _modules_of(names: Iterable[str]) -> set[str]:
    """The modules of tensor names (`lm_head.weight` -> `lm_head`)."""
    return {n.rpartition(".")[0] for n in names if "." in n}


# Layers whose fields are the checkpoint's own tensors, by class name: the `quant_method` whose
# `quantization_config` (the one the model was loaded with) is written back with them.
STORED = {"GPTQLinear": "gptq", "AWQLinear": "awq", "PackedLinear": "compressed-tensors"}


def _stored_save(
    model: Any, named: Mapping[str, Any], layers: Mapping[str, QuantLinear], method: str
) -> tuple[dict[str, Any], dict[str, Any] | None, set[str]]:
    """`hub_save` for layers loaded from GPTQ, AWQ or compressed-tensors files: their arrays
    under their own names, and the `quantization_config` the model was loaded with."""
    config = getattr(model, "config", None)
    qconfig = config.to_dict().get("quantization_config") if config is not None else None
    first = next(iter(layers))
    if not isinstance(qconfig, dict) or qconfig.get("quant_method") != method:
        raise ValueError(
            f"save_pretrained: the model holds {type(layers[first]).__name__} layers (e.g. "
            f"{first!r}) but its config has no quantization_config with quant_method="
            f"{method!r} (they are written only as loaded); dequantise first "
            "(treemod.quant.dequantise(model))."
        )
    fields = {f"{p}.{k}": p for p, layer in layers.items() for k in vars(layer) if k != "bias"}
    out: dict[str, Any] = {}
    float_names = set()
    for name, value in named.items():
        if name.endswith(".weight_shape") and name in fields:
            value = np.asarray(value, np.int64)  # compressed-tensors writes int64
        out[name] = value
        float_names.add(f"{fields[name]}.weight" if name in fields else name)
    return out, dict(qconfig), float_names


def _int4_save(
    model: Any, named: Mapping[str, Any], layers: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any] | None, set[str]]:
    """`hub_save` for treemod's int4 layers: GPTQ's tensors and config (`gptq_from_int4`)."""
    tensors, qconfig = gptq_from_int4(layers, _floats(model))
    own = {f"{p}.{field}" for p in layers for field in ("weight", "scales", "zeros")}
    out = {name: value for name, value in named.items() if name not in own}
    float_names = set(out) | {f"{p}.weight" for p in layers}
    return out | tensors, qconfig, float_names


def hub_save(
    model: Any, named: Mapping[str, Any], tied: Iterable[str] = ()
) -> tuple[dict[str, Any], dict[str, Any] | None, set[str]]:
    """The tensors and `quantization_config` `transformers` writes for `model`: bitsandbytes'
    for NF4 and int8 layers, GPTQ's for int4 ones (`gptq_from_int4`), and a loaded GPTQ, AWQ
    or compressed-tensors checkpoint's own.

    Arguments:
        model: the model (with or without quantised layers).
        named: its tensors by treemod's names (`treemod.state_dict`).
        tied: the names of the tensors tied to another (`lm_head.weight` of a model whose head
            is its embedding): their modules stay float in transformers too.

    Returns:
        `(tensors, quantization_config, float_names)`: the tensors by `transformers`' names,
        the config (`None` without quantised layers) and the names the float model would have
        (for the structure check).

    Raises:
        ValueError: layers of two schemes in one model, int4 layers GPTQ cannot hold as they
            are (see `gptq_from_int4`), or GPTQ / AWQ / compressed-tensors layers without the
            `quantization_config` they were loaded with; the message names a layer and what to
            do.
    """
    layers = quantised_layers(model)
    if not layers:
        return dict(named), None, set(named)
    kinds = {type(layer).__name__ for layer in layers.values()}
    if len(kinds) == 1 and next(iter(kinds)) in STORED:
        return _stored_save(model, named, layers, STORED[next(iter(kinds))])
    if kinds == {"Int4Linear"}:
        return _int4_save(model, named, layers)
    if not kinds <= {"NF4Linear", "Int8Linear"} or len(kinds) > 1:
        other = (n for n, v in layers.items() if not isinstance(v, NF4Linear | Int8Linear))
        first = next(other, next(iter(layers)))
        raise ValueError(
            f"save_pretrained: the model holds {' and '.join(sorted(kinds))} layers (e.g. "
            f"{first!r}); a checkpoint holds one scheme (NF4 or int8: bitsandbytes' format, "
            "int4: GPTQ's). Quantise with one scheme, or treemod.quant.dequantise(model) first."
        )
    out: dict[str, Any] = {}
    float_names: set[str] = set()
    owner = {}
    for p in layers:
        for field in ("weight", "absmax", "nested_absmax", "offset"):
            owner[f"{p}.{field}"] = p
    for name, value in named.items():
        if name not in owner:
            out[name] = value
            float_names.add(name)
    for p, layer in layers.items():
        out.update(bnb_saved(layer, p, named))
        float_names.add(f"{p}.weight")
    first_layer = next(iter(layers.values()))
    dtype = first_layer.dtype
    four = isinstance(first_layer, NF4Linear)
    qconfig: dict[str, Any] = {
        "_load_in_4bit": four,
        "_load_in_8bit": not four,
        "bnb_4bit_compute_dtype": dtype,
        "bnb_4bit_quant_storage": "uint8",
        "bnb_4bit_quant_type": bnb_quant_type(layers.values()) if four else "fp4",
        "bnb_4bit_use_double_quant": four and first_layer.offset is not None,  # type: ignore[attr-defined]
        "llm_int8_enable_fp32_cpu_offload": False,
        "llm_int8_has_fp16_weight": False,
        # transformers quantises every Linear not listed here (a tied head included, which
        # treemod holds as the embedding), so the float ones are listed.
        "llm_int8_skip_modules": _floats(model) + sorted(_modules_of(tied)) or None,
        "llm_int8_threshold": 6.0,
        "load_in_4bit": four,
        "load_in_8bit": not four,
        "quant_method": "bitsandbytes",
    }
    if isinstance(first_layer, Int8Linear) or not four:
        qconfig["bnb_4bit_use_double_quant"] = False
    return out, qconfig, float_names
