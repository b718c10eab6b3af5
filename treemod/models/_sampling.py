"""Choosing the next token from logits: greedy, or sampling after `transformers`' warpers.

The warpers are `transformers`' logits processors for sampling, in its order: temperature
(`TemperatureLogitsWarper`), top-k (`TopKLogitsWarper`), top-p (`TopPLogitsWarper`), each
setting the removed tokens' logits to minus infinity and keeping at least one token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

__all__ = ["choose", "top_k_filter", "top_p_filter"]


def top_k_filter(logits: Array, top_k: int) -> Array:
    """Keep the `top_k` largest logits per row (ties with the k-th kept too), others `-inf`.

    Arguments:
        logits: `(batch, vocab)` float logits.
        top_k: how many to keep (capped at the vocabulary size).

    Returns:
        The filtered logits.
    """
    k = min(top_k, logits.shape[-1])
    kth = lax.top_k(logits, k)[0][..., -1:]
    return jnp.where(logits < kth, -jnp.inf, logits)


def top_p_filter(logits: Array, top_p: float | Array) -> Array:
    """Keep the smallest set of most likely tokens whose probability reaches `top_p`.

    As `TopPLogitsWarper`: sorted ascending, the tokens whose cumulative probability is at
    most `1 - top_p` are removed, the most likely token always kept.

    Arguments:
        logits: `(batch, vocab)` float logits.
        top_p: the probability mass to keep, in `(0, 1]`.

    Returns:
        The filtered logits.
    """
    order = jnp.argsort(logits, axis=-1)
    ascending = jnp.take_along_axis(logits, order, axis=-1)
    cumulative = jnp.cumsum(jax.nn.softmax(ascending, axis=-1), axis=-1)
    remove_sorted = (cumulative <= 1 - top_p).at[..., -1].set(False)
    remove = jnp.take_along_axis(remove_sorted, jnp.argsort(order, axis=-1), axis=-1)
    return jnp.where(remove, -jnp.inf, logits)


def choose(
    logits: Array,
    *,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    key: PRNGKeyArray | None,
) -> Array:
    """The next token per row: the argmax, or a sample from the warped distribution.

    Arguments:
        logits: `(batch, vocab)` float32 logits.
        do_sample: sample (else greedy).
        temperature: divides the logits before sampling.
        top_k: `None` or the number of tokens to keep.
        top_p: `None` or the probability mass to keep.
        key: the sampling key (needed when sampling).

    Returns:
        `(batch,)` int32 token ids.
    """
    if not do_sample:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    assert key is not None
    if temperature != 1.0:
        logits = logits / temperature
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None and top_p < 1.0:
        logits = top_p_filter(logits, top_p)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
