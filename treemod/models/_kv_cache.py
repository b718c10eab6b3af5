"""The causal language models' forward pass over a key-value cache, for generation.

A cache holds every layer's keys and values for a fixed number of slots:
`(keys, values)`, each `(num_layers, batch, max_len, kv_heads, head_dim)`. A call writes the
new tokens' keys and values at slot `offset` (with `lax.dynamic_update_slice`, in place inside
the scan over layers) and attends over all slots under a mask built from the slots' validity
(left padding is invalid) and their index: a query at slot `s` sees slots `<= s`, and within a
sliding window those `> s - window`. Slot and position differ only by a row's padding, so
masking by slot is masking by position, as `transformers`' cache masks do.

The layers are the model's own: this file calls their submodules (`LlamaAttention.project`,
`attend`, the norms and MLPs), so LoRA adapters and precision policies apply unchanged.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import Array, lax

from treemod._tree.filters import combine, is_array, partition
from treemod.models._attention_parts import attend
from treemod.models._gpt2 import GPT2LMHeadModel
from treemod.models._llama import LlamaForCausalLM

__all__ = ["CausalLM", "cache_shape", "cached_logits", "check_model", "slot_mask"]

CausalLM = GPT2LMHeadModel | LlamaForCausalLM
Cache = tuple[Array, Array]


def check_model(model: Any) -> None:
    """Raise a `TypeError` naming `model`'s class unless generation supports it."""
    if not isinstance(model, GPT2LMHeadModel | LlamaForCausalLM):
        raise TypeError(
            f"generate: {type(model).__name__} is not a causal language model of "
            "treemod.models; pass a GPT2LMHeadModel or a Llama-family *ForCausalLM "
            "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."
        )


def cache_shape(model: CausalLM, batch: int, max_len: int) -> tuple[tuple[int, ...], Any]:
    """The shape `(layers, batch, max_len, kv_heads, head_dim)` of keys (and values), and dtype."""
    if isinstance(model, GPT2LMHeadModel):
        body = model.transformer
        attn = body.h.layers.attn
        embed = body.wte.weight.shape[1]
        heads = attn.num_heads
        shape = (len(body.h), batch, max_len, heads, embed // heads)
        return shape, body.wte.weight.dtype
    llama = model.model
    sa = llama.layers.layers.self_attn
    shape = (len(llama.layers), batch, max_len, sa.num_key_value_heads, sa.head_dim)
    return shape, llama.embed_tokens.weight.dtype


def slot_mask(q_len: int, offset: Array, valid: Array, window: int | None) -> Array:
    """Booleans `(batch, 1, q_len, max_len)`: which cache slots each new token attends to.

    Arguments:
        q_len: the number of new tokens, at slots `offset .. offset + q_len - 1`.
        offset: the first new slot (a scalar integer array).
        valid: `(batch, max_len)` booleans, True for the slots holding real tokens.
        window: `None`, or the sliding window (the query's own slot included).

    Returns:
        True where a query may attend.
    """
    query = offset + jnp.arange(q_len)[:, None]
    slot = jnp.arange(valid.shape[1])[None, :]
    allowed = slot <= query
    if window is not None:
        allowed &= slot > query - window
    return allowed[None, None] & valid[:, None, None, :]


def cached_logits(
    model: CausalLM, ids: Array, positions: Array, valid: Array, cache: Cache, offset: Array
) -> tuple[Array, Cache]:
    """The next-token logits after `ids`, with their keys and values written into `cache`.

    Arguments:
        model: the language model.
        ids: `(batch, q_len)` new token ids, for slots `offset ..`.
        positions: `(batch, q_len)` their position ids.
        valid: `(batch, max_len)` booleans, True for slots holding real tokens (new ones too).
        cache: `(keys, values)` as `cache_shape` gives.
        offset: the first slot of `ids` (a scalar integer array).

    Returns:
        `(logits, cache)`: float32 logits `(batch, vocab)` at the last new token, and the cache.
    """
    if isinstance(model, GPT2LMHeadModel):
        hidden, cache = _gpt2(model, ids, positions, valid, cache, offset)
        head = model.lm_head
        weight = model.transformer.wte.weight
    else:
        hidden, cache = _llama(model, ids, positions, valid, cache, offset)
        head = model.lm_head
        weight = model.model.embed_tokens.weight
    last = hidden[:, -1]
    if head is not None:
        logits = head(last)
    else:
        logits = lax.dot_general(last, weight, (((1,), (1,)), ((), ())))
    return logits.astype(jnp.float32), cache


def _write(cache: Array, layer: Array, new: Array, offset: Array) -> tuple[Array, Array]:
    """Write `new` `(batch, q_len, heads, dim)` at `[layer, :, offset]`; return cache and slice."""
    zero = jnp.zeros((), jnp.int32)
    start = (layer.astype(jnp.int32), zero, offset.astype(jnp.int32), zero, zero)
    cache = lax.dynamic_update_slice(cache, new[None].astype(cache.dtype), start)
    return cache, lax.dynamic_index_in_dim(cache, layer, axis=0, keepdims=False)


def _gpt2(
    model: GPT2LMHeadModel, ids: Array, positions: Array, valid: Array, cache: Cache, offset: Array
) -> tuple[Array, Cache]:
    body = model.transformer
    batch, q_len = ids.shape
    hidden = body.wte(ids) + body.wpe(positions)
    mask = slot_mask(q_len, offset, valid, None)
    arrays, static = partition(body.h.layers, is_array)

    def step(carry: Any, layer_arrays: Any) -> tuple[Any, None]:
        x, layer_index, keys, values = carry
        layer = combine(layer_arrays, static)
        attn = layer.attn
        embed = x.shape[-1]
        head_dim = embed // attn.num_heads
        q, k, v = jnp.split(attn.c_attn(layer.ln_1(x)), 3, axis=-1)
        q, k, v = (t.reshape(batch, q_len, attn.num_heads, head_dim) for t in (q, k, v))
        keys, k_all = _write(keys, layer_index, k, offset)
        values, v_all = _write(values, layer_index, v, offset)
        scale: Any = attn.scales[0]
        if len(attn.scales) > 1:
            scale = jnp.asarray(attn.scales, jnp.float32)[layer_index]
        out = attend(q, k_all, v_all, mask, scale=scale, float32_scores=attn.upcast)
        y = x + attn.c_proj(out.reshape(batch, q_len, embed))
        y = y + layer.mlp(layer.ln_2(y))
        return (y.astype(x.dtype), layer_index + 1, keys, values), None

    start = (hidden, jnp.zeros((), jnp.int32), *cache)
    (hidden, _, keys, values), _ = lax.scan(step, start, arrays)
    return body.ln_f(hidden), (keys, values)


def _llama(
    model: LlamaForCausalLM, ids: Array, positions: Array, valid: Array, cache: Cache, offset: Array
) -> tuple[Array, Cache]:
    body = model.model
    batch, q_len = ids.shape
    hidden = body.embed_tokens(ids)
    cos, sin = body.rotary_emb(positions, hidden.dtype)
    kinds = sorted(set(body.layer_kinds))
    windows = [None if kind == 0 else body.sliding_window for kind in kinds]
    masks = jnp.stack([slot_mask(q_len, offset, valid, w) for w in windows])
    index = jnp.asarray([kinds.index(kind) for kind in body.layer_kinds], jnp.int32)
    arrays, static = partition(body.layers.layers, is_array)

    def step(carry: Any, layer_arrays: Any) -> tuple[Any, None]:
        x, layer_index, keys, values = carry
        layer = combine(layer_arrays, static)
        attn = layer.self_attn
        q, k, v = attn.project(layer.input_layernorm(x), cos, sin)
        keys, k_all = _write(keys, layer_index, k, offset)
        values, v_all = _write(values, layer_index, v, offset)
        mask = masks[0] if len(kinds) == 1 else masks[index[layer_index]]
        out = attend(q, k_all, v_all, mask, scale=attn.head_dim**-0.5)
        y = x + attn.o_proj(out.reshape(batch, q_len, attn.num_heads * attn.head_dim))
        y = y + layer.mlp(layer.post_attention_layernorm(y))
        return (y.astype(x.dtype), layer_index + 1, keys, values), None

    start = (hidden, jnp.zeros((), jnp.int32), *cache)
    (hidden, _, keys, values), _ = lax.scan(step, start, arrays)
    return body.norm(hidden), (keys, values)
