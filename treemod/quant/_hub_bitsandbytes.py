"""bitsandbytes checkpoints as `transformers` writes them: the tensor layout of a 4-bit (NF4 or
FP4) or 8-bit layer, read into `NF4Linear` / `Int8Linear` as stored and written back the same
way.

A `Linear4bit` at `p` is stored as `p.weight` (uint8 `(n/2, 1)`, the packed levels),
`p.weight.absmax`, `p.weight.quant_map` (the 16 levels), with double quantisation
`p.weight.nested_absmax` and `p.weight.nested_quant_map` (bitsandbytes' dynamic map), and
`p.weight.quant_state.bitsandbytes__nf4` (or `__fp4`): a JSON object as uint8 bytes with the
quant type, block size, dtype, shape and the nested offset (bitsandbytes'
`QuantState.as_dict(packed=True)`). A
`Linear8bitLt` at `p` is `p.weight` (int8 `(out, in)`), `p.SCB` (float32 `(out,)`, each row's
absmax) and `p.weight_format` (uint8 scalar, 0: row-major).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from treemod._saving.errors import CheckpointError

from . import _formats as fmt
from ._layers import Int8Linear, NF4Linear, layer_fields, nf4_unit, row_slices

__all__ = [
    "BnbLayer",
    "bnb_config",
    "bnb_layers",
    "bnb_quant_type",
    "bnb_saved",
    "bnb_skeleton_layer",
    "bnb_view",
]

STATE = ".weight.quant_state.bitsandbytes__"
Read = Callable[[str], np.ndarray]


@dataclass(frozen=True)
class BnbLayer:
    """One quantised layer of a bitsandbytes checkpoint, from its tensors and JSON state.

    Arguments:
        name: the layer's name (`model.layers.0.self_attn.q_proj`).
        kind: `"nf4"`, `"fp4"` or `"int8"`.
        block_size: the 4-bit block size (0 for int8).
        offset: the nested offset (4-bit with double quantisation), else `None`.
        shape: the float weight's `(out, in)` (4-bit; int8 reads it from the weight).
    """

    name: str
    kind: str
    block_size: int = 0
    offset: float | None = None
    shape: tuple[int, ...] = ()


def bnb_config(qconfig: Mapping[str, Any], where: str) -> str:
    """The scheme a bitsandbytes `quantization_config` stores: `"nf4"`, `"fp4"` or `"int8"`.

    Arguments:
        qconfig: `config.json`'s `quantization_config` (`quant_method` `"bitsandbytes"`).
        where: the file, for messages.

    Returns:
        `"nf4"`, `"fp4"` or `"int8"`.

    Raises:
        CheckpointError: a 4-bit type other than NF4 and FP4, a storage dtype other than
            uint8, int8 with float weights kept, or neither 4- nor 8-bit; the message names
            the option.
    """
    four, eight = bool(qconfig.get("load_in_4bit")), bool(qconfig.get("load_in_8bit"))
    if four == eight:
        raise CheckpointError(
            f"{where}: quantization_config has load_in_4bit={four} and load_in_8bit={eight}; "
            "a bitsandbytes checkpoint sets exactly one."
        )
    if four:
        # transformers' default 4-bit type is FP4.
        kind = qconfig.get("bnb_4bit_quant_type", "fp4")
        if kind not in fmt.CODES_4BIT:
            raise CheckpointError(
                f"{where}: quantization_config.bnb_4bit_quant_type={kind!r} is not read; "
                "treemod reads bitsandbytes' 'nf4' and 'fp4' 4-bit checkpoints (and 8-bit ones)."
            )
        storage = qconfig.get("bnb_4bit_quant_storage", "uint8")
        if storage != "uint8":
            raise CheckpointError(
                f"{where}: quantization_config.bnb_4bit_quant_storage={storage!r} is not read; "
                "treemod reads 4-bit levels packed in uint8 (transformers' default)."
            )
        return str(kind)
    if qconfig.get("llm_int8_has_fp16_weight"):
        raise CheckpointError(
            f"{where}: quantization_config.llm_int8_has_fp16_weight=true keeps float weights; "
            "treemod reads bitsandbytes 8-bit checkpoints with int8 weights (the default)."
        )
    return "int8"


def _state(read: Read, name: str, where: str) -> dict[str, Any]:
    raw = bytes(np.asarray(read(name), np.uint8))
    try:
        state = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{where}: {name} is not bitsandbytes' JSON state ({e}).") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{where}: {name} holds {state!r}, not a JSON object.")
    return state


def _same_table(read: Read, name: str, table: np.ndarray, where: str) -> None:
    got = np.asarray(read(name))
    if got.shape != table.shape or not np.array_equal(
        got.astype(np.float32).view(np.uint32), table.view(np.uint32)
    ):
        raise CheckpointError(
            f"{where}: {name} is not bitsandbytes' standard code table; treemod's 4-bit layers "
            "use the standard NF4 or FP4 levels and dynamic map only."
        )


def bnb_layers(
    kind: str, tensors: Mapping[str, Any], read: Read, where: str
) -> dict[str, BnbLayer]:
    """The quantised layers of a bitsandbytes checkpoint, by name, checked.

    Arguments:
        kind: `"nf4"`, `"fp4"` or `"int8"` (`bnb_config`).
        tensors: the checkpoint's tensors by name (each with `.shape` and `.dtype`).
        read: reads one tensor whole.
        where: the checkpoint directory, for messages.

    Returns:
        Each quantised layer's `BnbLayer`.

    Raises:
        CheckpointError: a state of another 4-bit type than `kind`, a block size bitsandbytes
            does not make, a non-standard code table or a weight format other than row-major.
    """
    out: dict[str, BnbLayer] = {}
    if kind == "int8":
        for name in tensors:
            if name.endswith(".SCB"):
                p = name[: -len(".SCB")]
                fmt_name = f"{p}.weight_format"
                if fmt_name in tensors and int(np.asarray(read(fmt_name))) != 0:
                    raise CheckpointError(
                        f"{where}: {fmt_name} is {int(np.asarray(read(fmt_name)))}; treemod "
                        "reads bitsandbytes' row-major int8 weights (format 0) only."
                    )
                out[p] = BnbLayer(p, "int8")
        return out
    for name in tensors:
        if STATE not in name:
            continue
        p, quant_type = name.split(STATE)
        state = _state(read, name, where)
        if quant_type != kind or state.get("quant_type") != kind:
            raise CheckpointError(
                f"{where}: {name} is a {state.get('quant_type')!r} state; the config's "
                f"bnb_4bit_quant_type is {kind!r}."
            )
        block = state.get("blocksize")
        nested = "nested_offset" in state
        if block not in (32, 64, 128, 256, 512, 1024, 2048, 4096) or (
            nested and state.get("nested_blocksize") != fmt.NESTED_BLOCK
        ):
            raise CheckpointError(
                f"{where}: {name} has blocksize={block!r}, nested_blocksize="
                f"{state.get('nested_blocksize')!r}; treemod reads bitsandbytes' block sizes "
                "(32 to 4096, nested 256)."
            )
        _same_table(read, f"{p}.weight.quant_map", fmt.code_4bit(kind), where)
        if nested:
            _same_table(read, f"{p}.weight.nested_quant_map", fmt.DYNAMIC_CODE, where)
        offset = float(state["nested_offset"]) if nested else None
        out[p] = BnbLayer(p, kind, int(block), offset, tuple(state.get("shape", ())))
    return out


def bnb_skeleton_layer(layer: Any, hub: BnbLayer, where: str) -> Any:
    """The quantised layer (zero arrays of the stored shapes) that replaces `layer`, a float
    `Linear` of the model, before the checkpoint's arrays are read into it.

    Arguments:
        layer: the model's `Linear` at `hub.name`.
        hub: the stored layer.
        where: the checkpoint directory, for messages.

    Returns:
        An `NF4Linear` or `Int8Linear`.
    """
    common = layer_fields(layer)
    n_out, n_in = common["out_features"], common["in_features"]
    if hub.kind == "int8":
        return Int8Linear(
            weight=jnp.zeros((n_out, n_in), jnp.int8),
            absmax=jnp.zeros((n_out,), jnp.float32),
            slices=row_slices(n_out, 1),
            **common,
        )
    if hub.shape != (n_out, n_in):
        raise CheckpointError(
            f"{where}: {hub.name}{STATE}{hub.kind} says shape {list(hub.shape)}; the model's layer "
            f"is {n_out}x{n_in}. The checkpoint is of another config."
        )
    blocks = -(-n_out * n_in // hub.block_size)
    nested = hub.offset is not None
    return NF4Linear(
        weight=jnp.zeros((n_out * n_in // 2,), jnp.uint8),
        absmax=jnp.zeros((blocks,), jnp.uint8 if nested else jnp.float32),
        nested_absmax=jnp.zeros((-(-blocks // fmt.NESTED_BLOCK),), jnp.float32) if nested else None,
        offset=jnp.zeros((), jnp.float32) if nested else None,
        block_size=hub.block_size,
        quant_type=hub.kind,
        slices=row_slices(n_out, nf4_unit(n_in, hub.block_size)),
        **common,
    )


def bnb_view(
    tensors: Mapping[str, Any], layers: Mapping[str, BnbLayer], renamed: Callable[..., Any]
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The checkpoint's tensors under the names of treemod's layers' fields.

    Arguments:
        tensors: the checkpoint's tensors (`FileTensor`s) by name.
        layers: the quantised layers (`bnb_layers`).
        renamed: `dataclasses.replace`-like: `renamed(info, name=..., shape=...)`.

    Returns:
        `(tensors, values)`: the tensors by treemod's names (`p.weight`, `p.absmax`,
        `p.nested_absmax`, the same bytes; the code tables and states left out), and the
        values that live in the JSON states (`p.offset`), by name.
    """
    out = dict(tensors)
    values: dict[str, np.ndarray] = {}
    for p, hub in layers.items():
        if hub.kind == "int8":
            out[f"{p}.absmax"] = renamed(out.pop(f"{p}.SCB"), name=f"{p}.absmax")
            out.pop(f"{p}.weight_format", None)
            continue
        w = out[f"{p}.weight"]
        out[f"{p}.weight"] = renamed(w, shape=(int(np.prod(w.shape)),))
        out[f"{p}.absmax"] = renamed(out.pop(f"{p}.weight.absmax"), name=f"{p}.absmax")
        for gone in ("quant_map", "nested_quant_map", f"quant_state.bitsandbytes__{hub.kind}"):
            out.pop(f"{p}.weight.{gone}", None)
        if hub.offset is not None:
            nested = out.pop(f"{p}.weight.nested_absmax")
            out[f"{p}.nested_absmax"] = renamed(nested, name=f"{p}.nested_absmax")
            out[f"{p}.offset"] = renamed(nested, name=f"{p}.offset", shape=(), offset=-1)
            values[f"{p}.offset"] = np.array(hub.offset, np.float32)
    return out, values


def bnb_saved(layer: Any, p: str, named: Mapping[str, Any]) -> dict[str, Any]:
    """The tensors `transformers` writes for the quantised layer `layer` at `p`.

    Arguments:
        layer: an `NF4Linear` or `Int8Linear`.
        p: its name.
        named: the model's tensors by treemod's names.

    Returns:
        The layer's tensors by `transformers`' names (the bias not included).
    """
    if isinstance(layer, Int8Linear):
        return {
            f"{p}.weight": named[f"{p}.weight"],
            f"{p}.SCB": named[f"{p}.absmax"],
            f"{p}.weight_format": np.array(0, np.uint8),
        }
    state: dict[str, Any] = {
        "quant_type": layer.quant_type,
        "blocksize": layer.block_size,
        "dtype": layer.dtype,
        "shape": [layer.out_features, layer.in_features],
    }
    out = {
        f"{p}.weight": np.asarray(named[f"{p}.weight"]).reshape(-1, 1),
        f"{p}.weight.absmax": named[f"{p}.absmax"],
        f"{p}.weight.quant_map": fmt.code_4bit(layer.quant_type),
    }
    if layer.offset is not None:
        out[f"{p}.weight.nested_absmax"] = named[f"{p}.nested_absmax"]
        out[f"{p}.weight.nested_quant_map"] = fmt.DYNAMIC_CODE
        state.update(
            nested_blocksize=fmt.NESTED_BLOCK,
            nested_dtype="float32",
            nested_offset=float(np.asarray(named[f"{p}.offset"], np.float32)),
        )
    # bitsandbytes' `pack_dict_to_tensor`: `json.dumps` with its default separators, as bytes.
    out[f"{p}{STATE}{layer.quant_type}"] = np.frombuffer(
        json.dumps(state).encode("utf-8"), np.uint8
    ).copy()
    return out


def bnb_quant_type(layers: Iterable[Any]) -> str:
    """The one `bnb_4bit_quant_type` of a model's 4-bit layers (`"nf4"` without any).

    Arguments:
        layers: the model's quantised layers.

    Returns:
        `"nf4"` or `"fp4"`.

    Raises:
        ValueError: NF4 and FP4 layers together (transformers' config holds one type).
    """
    kinds = sorted({layer.quant_type for layer in layers if isinstance(layer, NF4Linear)})
    if len(kinds) > 1:
        raise ValueError(
            f"save_pretrained: the model holds NF4Linear layers of quant_type {kinds}; "
            "transformers' bnb_4bit_quant_type is one. Quantise with one scheme."
        )
    return kinds[0] if kinds else "nf4"
