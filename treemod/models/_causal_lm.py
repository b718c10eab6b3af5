"""`CausalLM`, the base of the causal language models, and `KVCache`, the keys they keep.

`generate` reads a model through this contract only: `lm_parts()` gives its decoder (a
`Decoder`: `cache_layout()` sizes the cache, `decode(ids, positions, cache)` runs the layers
over new tokens with the cache), token embedding and head, and `logits(hidden)` is the
language-modelling head, tied or not. A family implements `decode` with its own layers: the
cache is an argument of its attention (`cache=None` outside generation), carried through the
layers' `nn.Stack` scan, so LoRA adapters and precision policies apply unchanged.

A `KVCache` holds every layer's keys and values for a fixed number of slots, each
`(num_layers, batch, max_len, kv_heads, head_dim)`. An attention's `write` puts the new
tokens' keys and values at slot `offset` of the cache's current `layer` (in place inside the
scan) and moves the cache on to the next layer. `mask` attends over the slots by their validity
(left padding is invalid) and index: a query at slot `s` sees slots `<= s`, and within a sliding
window those `> s - window`. Slot and position differ only by a row's padding, so masking by
slot is masking by position, as `transformers`' cache masks do.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple, Protocol, TypeVar

import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod.models._base import PretrainedModel

__all__ = [
    "CacheLayout",
    "CausalLM",
    "Decoder",
    "KVCache",
    "LMParts",
    "MaybeCache",
    "build_lm_head",
    "cached_logits",
]


class CacheLayout(NamedTuple):
    """What a model's key-value cache holds per slot: its layers, key-value heads, dtype."""

    num_layers: int
    kv_heads: int
    head_dim: int
    dtype: Any


class KVCache(NamedTuple):
    """Every layer's keys and values for `max_len` slots, and which slots the next call fills.

    Arguments:
        keys: `(num_layers, batch, max_len, kv_heads, head_dim)`.
        values: the same shape.
        valid: `(batch, max_len)` booleans, True for the slots holding real tokens (the new
            ones included).
        offset: the first slot of the new tokens (a scalar integer array).
        layer: the layer the next `write` goes to (a scalar integer array).
    """

    keys: Array
    values: Array
    valid: Array
    offset: Array
    layer: Array

    @classmethod
    def empty(cls, layout: CacheLayout, batch: int, max_len: int) -> KVCache:
        """A cache of zeros with no valid slot, ready for tokens at slot 0 of layer 0."""
        shape = (layout.num_layers, batch, max_len, layout.kv_heads, layout.head_dim)
        zero = jnp.zeros((), jnp.int32)
        keys = jnp.zeros(shape, layout.dtype)
        return cls(keys, jnp.zeros_like(keys), jnp.zeros((batch, max_len), bool), zero, zero)

    def at(self, offset: Array, valid: Array) -> KVCache:
        """The cache ready for new tokens from slot `offset`, `valid` marking real slots."""
        return self._replace(valid=valid, offset=offset, layer=jnp.zeros((), jnp.int32))

    def mask(self, q_len: int, window: int | None) -> Array:
        """Booleans `(batch, 1, q_len, max_len)`: which slots each of `q_len` new tokens sees.

        Arguments:
            q_len: the number of new tokens, at slots `offset .. offset + q_len - 1`.
            window: `None`, or the sliding window (the query's own slot included).

        Returns:
            True where a query may attend.
        """
        query = self.offset + jnp.arange(q_len)[:, None]
        slot = jnp.arange(self.valid.shape[1])[None, :]
        allowed = slot <= query
        if window is not None:
            allowed &= slot > query - window
        return allowed[None, None] & self.valid[:, None, None, :]

    def write(self, k: Array, v: Array) -> tuple[KVCache, Array, Array]:
        """Write the new `k` and `v` `(batch, q_len, kv_heads, head_dim)` at the current layer.

        Returns:
            `(cache, keys, values)`: the cache moved on to the next layer, and this layer's
            keys and values over every slot `(batch, max_len, kv_heads, head_dim)`.
        """
        keys, k_all = _write(self.keys, self.layer, k, self.offset)
        values, v_all = _write(self.values, self.layer, v, self.offset)
        return self._replace(keys=keys, values=values, layer=self.layer + 1), k_all, v_all


MaybeCache = TypeVar("MaybeCache", KVCache, None)
"""A decoder's cache argument: a `KVCache` in `generate`, `None` in a plain forward pass."""


def _write(cache: Array, layer: Array, new: Array, offset: Array) -> tuple[Array, Array]:
    """Write `new` at `[layer, :, offset]`; return the cache and the layer's slice."""
    zero = jnp.zeros((), jnp.int32)
    start = (layer.astype(jnp.int32), zero, offset.astype(jnp.int32), zero, zero)
    cache = lax.dynamic_update_slice(cache, new[None].astype(cache.dtype), start)
    return cache, lax.dynamic_index_in_dim(cache, layer, axis=0, keepdims=False)


class Decoder(Protocol):
    """A causal LM's decoder as `generate` runs it (`GPT2Model`, `LlamaModel`, ...)."""

    def cache_layout(self) -> CacheLayout:
        """The cache's layers, key-value heads, head size and dtype."""
        ...

    def decode(self, ids: Array, positions: Array, cache: KVCache) -> tuple[Array, KVCache]:
        """The last hidden states over new tokens, reading and filling `cache`.

        Arguments:
            ids: `(batch, q_len)` new token ids, for slots `cache.offset ..`.
            positions: `(batch, q_len)` their position ids.
            cache: the cache, at layer 0.

        Returns:
            `(hidden, cache)`: `(batch, q_len, hidden)` and the cache with the new keys.
        """
        ...


class LMParts(NamedTuple):
    """What a causal LM is made of, for `generate` and the head."""

    decoder: Decoder
    token_embedding: nn.Embedding
    lm_head: nn.Linear | None  # None: tied to `token_embedding`


class CausalLM(PretrainedModel):
    """The base of the causal language models: the contract `generate` reads.

    A subclass implements `lm_parts` (its decoder, token embedding and head: `lm_head`, `None`
    when tied to the embedding) and names the embedding in `token_embedding_name`; `logits` is
    the head, tied or not, and `tied_weights` names the tie. `max_positions` names a limit on
    positions (learned absolute position embeddings), checked by `generate`.
    """

    # The dotted name of the token embedding (`"transformer.wte"`), for `tied_weights`.
    token_embedding_name: ClassVar[str]

    @abc.abstractmethod
    def lm_parts(self) -> LMParts:
        """The decoder, the token embedding, and the head (`None` when tied)."""

    def max_positions(self) -> tuple[str, int] | None:
        """`(config key, limit)` when no position reaches `limit`; `None` (the default) else."""
        return None

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The language-modelling head: `(..., hidden)` to `(..., vocab_size)` logits (`key`:
        the head's, for LoRA dropout on `lm_head`)."""
        _, embedding, head = self.lm_parts()
        if head is not None:
            return head(hidden, key=key)
        weight = embedding.weight
        return lax.dot_general(hidden, weight, (((hidden.ndim - 1,), (1,)), ((), ())))

    def tied_weights(self) -> dict[str, str]:
        """`{"lm_head.weight": "<token embedding>.weight"}` when tied, else `{}`."""
        if self.lm_parts().lm_head is None:
            return {"lm_head.weight": f"{self.token_embedding_name}.weight"}
        return {}


def build_lm_head(
    hidden: int, vocab: int, tied: bool, std: float, dtype: Any, *, key: PRNGKeyArray
) -> nn.Linear | None:
    """A bias-free `nn.Linear` head from N(0, std²), or `None` when tied to the embedding."""
    if tied:
        return None
    dtype = jnp.float32 if dtype is None else dtype
    init = nn.init.normal(std)
    return nn.Linear(hidden, vocab, use_bias=False, dtype=dtype, weight_init=init, key=key)


def cached_logits(
    model: CausalLM, ids: Array, positions: Array, cache: KVCache
) -> tuple[Array, KVCache]:
    """The next-token logits after `ids`, with their keys and values written into `cache`.

    Arguments:
        model: the language model.
        ids: `(batch, q_len)` new token ids, for slots `cache.offset ..`.
        positions: `(batch, q_len)` their position ids.
        cache: the cache, ready for these tokens (`KVCache.at`).

    Returns:
        `(logits, cache)`: float32 logits `(batch, vocab)` at the last new token, and the cache.
    """
    hidden, cache = model.lm_parts().decoder.decode(ids, positions, cache)
    return model.logits(hidden[:, -1]).astype(jnp.float32), cache
