"""The native layers' hooks: where a treemod layer stores its tensors differently from its
PyTorch twin (`NATIVE_HOOKS`, read by `walk.py`; a user's own layers register theirs with
`register_state_dict_hooks`).

Layers absent here (`Linear`, `Embedding`, `LayerNorm`, `GroupNorm`, `RMSNorm`, channels-first
`Conv`) follow the general rule: their field names and layouts are PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax.numpy as jnp
import jax.tree_util as jtu
import numpy as np

import treemod.nn as nn
from treemod._module.state import State
from treemod._saving.errors import CheckpointError
from treemod._transforms.eval_shape import filter_eval_shape
from treemod._tree.filters import combine, is_array, partition
from treemod._tree.tree_at import tree_at

from .hooks import StateDictHooks
from .walk import entries_of, from_entries

__all__ = ["NATIVE_HOOKS"]

Entries = Mapping[str, Any]


def _is_none(x: Any) -> bool:
    return x is None


# Containers. ---------------------------------------------------------------------------------


def _sequential_to(seq: nn.Sequential) -> Entries:
    """`Sequential`: PyTorch numbers the layers directly (`0.weight`), without `layers.`."""
    return {str(i): layer for i, layer in enumerate(seq.layers)}


def _sequential_from(seq: nn.Sequential, t: Entries) -> nn.Sequential:
    layers = tuple(t[str(i)] for i in range(len(seq.layers)))
    new: nn.Sequential = tree_at(lambda s: s.layers, seq, layers)
    return new


def _stack_to(stack: nn.Stack) -> Entries:
    """`Stack`: its leading layer axis expanded into `0.`, `1.`, ... (no `layers.`)."""
    return {str(i): stack[i] for i in range(len(stack))}


def _stack_from(stack: nn.Stack, t: Entries) -> nn.Stack:
    arrays = [partition(t[str(i)], is_array)[0] for i in range(len(stack))]
    stacked = jtu.tree_map(lambda *xs: jnp.stack(xs), *arrays)
    static = partition(stack.layers, is_array)[1]
    new: nn.Stack = tree_at(lambda s: s.layers, stack, combine(stacked, static))
    return new


def _shared_to(shared: nn.Shared) -> Entries:
    """`Shared`: transparent, the tied tree with the tied nodes filled in (PyTorch writes a
    tied tensor under each of its names)."""
    return entries_of(shared(), NATIVE_HOOKS)


def _shared_from(shared: nn.Shared, t: Entries) -> nn.Shared:
    filled = from_entries(filter_eval_shape(lambda s: s(), shared), t, NATIVE_HOOKS)
    tied, source = shared.where(filled), shared.get(filled)
    for a, b in zip(jtu.tree_leaves(tied), jtu.tree_leaves(source), strict=True):
        if not np.array_equal(np.asarray(a), np.asarray(b)):
            raise CheckpointError(
                "the tied tensors (selected by the Shared's `where`) differ from the tensors "
                "they are tied to (its `get`); a tied weight must load equal in both places."
            )
    pytree = tree_at(shared.where, filled, replace_fn=lambda _: None)
    new: nn.Shared = tree_at(lambda s: s.pytree, shared, pytree, is_leaf=_is_none)
    return new


# Normalisation and activations. --------------------------------------------------------------


def _batch_norm_to(bn: nn.BatchNorm) -> Entries:
    """`BatchNorm`: running statistics from `State`, and PyTorch's `num_batches_tracked`.

    treemod's BatchNorm has a fixed momentum and keeps no batch count (PyTorch reads it only for
    `momentum=None`, which treemod refuses), so the count is written as 0 and, on loading,
    checked to be an integer scalar and otherwise not used."""
    return {
        "weight": bn.weight,
        "bias": bn.bias,
        "running_mean": bn.running_mean.value,
        "running_var": bn.running_var.value,
        "num_batches_tracked": np.zeros((), np.int64),
    }


def _batch_norm_from(bn: nn.BatchNorm, t: Entries) -> nn.BatchNorm:
    new: nn.BatchNorm = tree_at(
        lambda m: (m.weight, m.bias, m.running_mean, m.running_var),
        bn,
        (t["weight"], t["bias"], State(t["running_mean"]), State(t["running_var"])),
        is_leaf=_is_none,
    )
    return new


def _prelu_to(layer: nn.PReLU) -> Entries:
    return {"weight": layer.negative_slope}


def _prelu_from(layer: nn.PReLU, t: Entries) -> nn.PReLU:
    new: nn.PReLU = tree_at(lambda m: m.negative_slope, layer, t["weight"])
    return new


# Convolutions. -------------------------------------------------------------------------------


def _channels_first(w: Any, n: int) -> Any:
    """A channels-last kernel `(*kernel, in/groups, out)` as `(out, in/groups, *kernel)`."""
    return jnp.transpose(w, (n + 1, n, *range(n)))


def _channels_last(w: Any, n: int) -> Any:
    return jnp.transpose(w, (*range(2, n + 2), 1, 0))


def _conv_to(conv: nn.Conv) -> Entries:
    """`Conv`: PyTorch's kernel is channels-first; a channels-last kernel is transposed."""
    w = _channels_first(conv.weight, conv.num_spatial_dims) if conv.channels_last else conv.weight
    return {"weight": w, "bias": conv.bias}


def _conv_from(conv: nn.Conv, t: Entries) -> nn.Conv:
    w = _channels_last(t["weight"], conv.num_spatial_dims) if conv.channels_last else t["weight"]
    new: nn.Conv = tree_at(lambda m: (m.weight, m.bias), conv, (w, t["bias"]), is_leaf=_is_none)
    return new


def _swap_groups(w: Any, groups: int) -> Any:
    """`(a, b/groups, *kernel)` -> `(b, a/groups, *kernel)`: per group, the two channel axes
    swapped (treemod's transposed kernel `(out, in/groups)` <-> PyTorch's `(in, out/groups)`)."""
    a, b_per, *kernel = w.shape
    a_per = a // groups
    w = jnp.reshape(w, (groups, a_per, b_per, *kernel))
    w = jnp.swapaxes(w, 1, 2)
    return jnp.reshape(w, (groups * b_per, a_per, *kernel))


def _conv_transpose_to(conv: nn.ConvTranspose) -> Entries:
    """`ConvTranspose`: PyTorch stores `(in, out/groups, *kernel)`, treemod
    `(out, in/groups, *kernel)` (or channels-last)."""
    n = conv.num_spatial_dims
    w = _channels_first(conv.weight, n) if conv.channels_last else conv.weight
    return {"weight": _swap_groups(w, conv.groups), "bias": conv.bias}


def _conv_transpose_from(conv: nn.ConvTranspose, t: Entries) -> nn.ConvTranspose:
    n = conv.num_spatial_dims
    w = _swap_groups(t["weight"], conv.groups)
    w = _channels_last(w, n) if conv.channels_last else w
    new: nn.ConvTranspose = tree_at(
        lambda m: (m.weight, m.bias), conv, (w, t["bias"]), is_leaf=_is_none
    )
    return new


# Attention and recurrent cells. --------------------------------------------------------------


def _mha_to(mha: nn.MultiheadAttention) -> Entries:
    """`MultiheadAttention`: PyTorch packs the input projections in `in_proj_weight` (or keeps
    `q_proj_weight`, `k_proj_weight`, `v_proj_weight` when their shapes differ) and their
    biases in `in_proj_bias`; the output projection is `out_proj`."""
    projs = (mha.query_proj, mha.key_proj, mha.value_proj)
    shapes = {p.weight.shape for p in projs}
    out: dict[str, Any] = {}
    if len(shapes) == 1:
        out["in_proj_weight"] = jnp.concatenate([p.weight for p in projs])
    else:
        out |= {f"{n}_proj_weight": p.weight for n, p in zip("qkv", projs, strict=True)}
    biases = [p.bias for p in projs if p.bias is not None]
    if len(biases) == 3:
        out["in_proj_bias"] = jnp.concatenate(biases)
    elif biases:
        raise CheckpointError(
            "PyTorch's MultiheadAttention has biases on all three input projections or on "
            f"none, but this one has use_query_bias={mha.use_query_bias}, use_key_bias="
            f"{mha.use_key_bias}, use_value_bias={mha.use_value_bias}."
        )
    out["out_proj"] = mha.output_proj
    return out


def _mha_from(mha: nn.MultiheadAttention, t: Entries) -> nn.MultiheadAttention:
    projs = (mha.query_proj, mha.key_proj, mha.value_proj)
    if "in_proj_weight" in t:
        rows = np.cumsum([p.weight.shape[0] for p in projs])[:-1].tolist()
        weights = jnp.split(t["in_proj_weight"], rows)
    else:
        weights = [t[f"{n}_proj_weight"] for n in "qkv"]
    biases: list[Any] = [None, None, None]
    if "in_proj_bias" in t:
        rows = np.cumsum([p.weight.shape[0] for p in projs])[:-1].tolist()
        biases = jnp.split(t["in_proj_bias"], rows)
    new: nn.MultiheadAttention = tree_at(
        lambda m: (
            m.query_proj.weight,
            m.key_proj.weight,
            m.value_proj.weight,
            m.query_proj.bias,
            m.key_proj.bias,
            m.value_proj.bias,
            m.output_proj,
        ),
        mha,
        (*weights, *biases, t["out_proj"]),
        is_leaf=_is_none,
    )
    return new


def _lstm_to(cell: nn.LSTMCell) -> Entries:
    """`LSTMCell`: treemod keeps PyTorch's `bias_ih + bias_hh` as one `bias` (the gate order
    `i, f, g, o` is PyTorch's). The sum cannot be split back uniquely, so it is written as
    `bias_ih` with `bias_hh` zeros: PyTorch computes the same gates from them."""
    out = {"weight_ih": cell.weight_ih, "weight_hh": cell.weight_hh}
    if cell.bias is not None:
        out |= {"bias_ih": cell.bias, "bias_hh": jnp.zeros_like(cell.bias)}
    return out


def _lstm_from(cell: nn.LSTMCell, t: Entries) -> nn.LSTMCell:
    bias = None if cell.bias is None else t["bias_ih"] + t["bias_hh"]
    new: nn.LSTMCell = tree_at(
        lambda m: (m.weight_ih, m.weight_hh, m.bias),
        cell,
        (t["weight_ih"], t["weight_hh"], bias),
        is_leaf=_is_none,
    )
    return new


def _gru_to(cell: nn.GRUCell) -> Entries:
    """`GRUCell`: treemod's `bias` is PyTorch's `bias_ih + bias_hh` for the gates `r, z` and
    `bias_ih` for `n`; `bias_n` is the `bias_hh` of `n` (it sits inside `r * (...)`, so it
    stays apart). Written as `bias_ih = bias` and `bias_hh = (0, 0, bias_n)`: the same gates."""
    out = {"weight_ih": cell.weight_ih, "weight_hh": cell.weight_hh}
    if cell.bias is not None and cell.bias_n is not None:
        zeros = jnp.zeros(2 * cell.hidden_size, cell.bias.dtype)
        out |= {"bias_ih": cell.bias, "bias_hh": jnp.concatenate([zeros, cell.bias_n])}
    return out


def _gru_from(cell: nn.GRUCell, t: Entries) -> nn.GRUCell:
    bias = bias_n = None
    if cell.bias is not None:
        h = cell.hidden_size
        b_hh = t["bias_hh"]
        bias = t["bias_ih"] + jnp.concatenate([b_hh[: 2 * h], jnp.zeros(h, b_hh.dtype)])
        bias_n = b_hh[2 * h :]
    new: nn.GRUCell = tree_at(
        lambda m: (m.weight_ih, m.weight_hh, m.bias, m.bias_n),
        cell,
        (t["weight_ih"], t["weight_hh"], bias, bias_n),
        is_leaf=_is_none,
    )
    return new


# Weight reparametrisations: PyTorch's `nn.utils.parametrizations` names. ---------------------


def _inner_entries(wrapper: Any, kind: str) -> tuple[dict[str, Any], Any]:
    """The wrapped layer's entries without its weight, and the weight.

    Refused where the layer's PyTorch twin stores the weight in another layout (a transposed
    or channels-last convolution's kernel): the wrapper's norm runs over the stored axes, so it
    would mean something else in PyTorch's layout."""
    layer = wrapper.layer
    entries = entries_of(layer, NATIVE_HOOKS)
    name = wrapper.weight_name
    if entries.get(name) is not getattr(layer, name, None):
        last = " (channels_last=True)" if getattr(layer, "channels_last", False) else ""
        raise CheckpointError(
            f"{kind} of a {type(layer).__name__}{last} has no PyTorch twin: PyTorch stores "
            f"its {name!r} in another layout, so the norm would run over other axes; refused."
        )
    weight = entries.pop(name)
    return entries, weight


def _weight_norm_to(wn: nn.WeightNorm[Any]) -> Entries:
    """`WeightNorm`: `parametrizations.<weight>.original0` (the norm `g`) and `.original1`
    (the direction `v`), as PyTorch's `parametrizations.weight_norm`; for `axis=None` PyTorch's
    `g` is a scalar. Refused for transposed and channels-last convolutions (`_inner_entries`)."""
    entries, weight = _inner_entries(wn, "WeightNorm")
    g = jnp.reshape(wn.g, ()) if wn.axis is None else wn.g
    base = f"parametrizations.{wn.weight_name}"
    return {**entries, f"{base}.original0": g, f"{base}.original1": weight}


def _weight_norm_from(wn: nn.WeightNorm[Any], t: Entries) -> nn.WeightNorm[Any]:
    base = f"parametrizations.{wn.weight_name}"
    inner = {k: v for k, v in t.items() if not k.startswith(base + ".")}
    inner[wn.weight_name] = t[f"{base}.original1"]
    layer = from_entries(wn.layer, inner, NATIVE_HOOKS)
    g = jnp.reshape(t[f"{base}.original0"], wn.g.shape)
    new: nn.WeightNorm[Any] = tree_at(lambda m: (m.layer, m.g), wn, (layer, g))
    return new


def _spectral_norm_to(sn: nn.SpectralNorm[Any]) -> Entries:
    """`SpectralNorm`: `parametrizations.<weight>.original` and the power-iteration vectors
    `parametrizations.<weight>.0._u`, `._v`, as PyTorch's `parametrizations.spectral_norm`.
    Refused for transposed and channels-last convolutions (see `_inner_entries`)."""
    entries, weight = _inner_entries(sn, "SpectralNorm")
    base = f"parametrizations.{sn.weight_name}"
    return {
        **entries,
        f"{base}.original": weight,
        f"{base}.0._u": sn.u.value,
        f"{base}.0._v": sn.v.value,
    }


def _spectral_norm_from(sn: nn.SpectralNorm[Any], t: Entries) -> nn.SpectralNorm[Any]:
    base = f"parametrizations.{sn.weight_name}"
    inner = {k: v for k, v in t.items() if not k.startswith(base + ".")}
    inner[sn.weight_name] = t[f"{base}.original"]
    layer = from_entries(sn.layer, inner, NATIVE_HOOKS)
    new: nn.SpectralNorm[Any] = tree_at(
        lambda m: (m.layer, m.u, m.v),
        sn,
        (layer, State(t[f"{base}.0._u"]), State(t[f"{base}.0._v"])),
    )
    return new


def _pair(to: Callable[[Any], Entries], back: Callable[[Any, Entries], Any]) -> StateDictHooks[Any]:
    return StateDictHooks(to, back)


NATIVE_HOOKS: dict[type, StateDictHooks[Any]] = {
    nn.Sequential: _pair(_sequential_to, _sequential_from),
    nn.Stack: _pair(_stack_to, _stack_from),
    nn.Shared: _pair(_shared_to, _shared_from),
    nn.BatchNorm: _pair(_batch_norm_to, _batch_norm_from),
    nn.PReLU: _pair(_prelu_to, _prelu_from),
    # Each dimension named too: the mapping must not depend on the classes' hierarchy.
    **{cls: _pair(_conv_to, _conv_from) for cls in (nn.Conv, nn.Conv1d, nn.Conv2d, nn.Conv3d)},
    **{
        cls: _pair(_conv_transpose_to, _conv_transpose_from)
        for cls in (
            nn.ConvTranspose,
            nn.ConvTranspose1d,
            nn.ConvTranspose2d,
            nn.ConvTranspose3d,
        )
    },
    nn.MultiheadAttention: _pair(_mha_to, _mha_from),
    nn.LSTMCell: _pair(_lstm_to, _lstm_from),
    nn.GRUCell: _pair(_gru_to, _gru_from),
    nn.WeightNorm: _pair(_weight_norm_to, _weight_norm_from),
    nn.SpectralNorm: _pair(_spectral_norm_to, _spectral_norm_from),
}
