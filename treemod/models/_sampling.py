"""Choosing the next token from logits, with `transformers`' logits processors, in its order.

First the processors every decoding applies (`process`): the repetition penalty
(`RepetitionPenaltyLogitsProcessor`), no end of sequence before `min_new_tokens`
(`MinNewTokensLengthLogitsProcessor`), suppressed tokens (`SuppressTokensLogitsProcessor`,
`SuppressTokensAtBeginLogitsProcessor`). Then, for sampling, the warpers (`warp`): temperature,
top-k, top-p, min-p, each setting the removed tokens' logits to minus infinity and keeping at
least one token. Greedy decoding takes the argmax of the processed logits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import Array, lax
from jaxtyping import PRNGKeyArray

from treemod.models._generation_config import GenerationSettings

__all__ = ["choose", "min_p_filter", "process", "top_k_filter", "top_p_filter", "warp"]


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


def min_p_filter(logits: Array, min_p: float) -> Array:
    """Remove the tokens less likely than `min_p` times the most likely one (`MinPLogitsWarper`;
    the most likely token is always kept).

    Arguments:
        logits: `(batch, vocab)` float logits.
        min_p: the fraction of the top probability a token needs, in `[0, 1]`.

    Returns:
        The filtered logits.
    """
    probs = jax.nn.softmax(logits, axis=-1)
    top = jnp.max(probs, axis=-1, keepdims=True)
    top_token = jnp.arange(logits.shape[-1])[None, :] == jnp.argmax(probs, axis=-1)[:, None]
    remove = (probs < min_p * top) & ~top_token
    return jnp.where(remove, -jnp.inf, logits)


def process(logits: Array, s: GenerationSettings, seen: Array | None, generated: Array) -> Array:
    """The processors every decoding applies, as `transformers` (see the module docstring).

    Arguments:
        logits: `(batch, vocab)` float32 logits.
        s: the generation's settings.
        seen: `(batch, vocab)` booleans, the tokens in each row so far (the prompt's, left
            padding left out, and the generated ones); None without a repetition penalty.
        generated: how many tokens each row has generated before this one (a scalar).

    Returns:
        The processed logits.
    """
    if s.repetition_penalty != 1.0 and seen is not None:
        p = s.repetition_penalty
        logits = jnp.where(seen, jnp.where(logits < 0, logits * p, logits / p), logits)
    vocab = logits.shape[-1]
    blocked = jnp.zeros((vocab,), bool)
    if s.suppress:
        blocked = blocked.at[jnp.asarray(s.suppress)].set(True)
    if s.begin_suppress:
        first = jnp.zeros((vocab,), bool).at[jnp.asarray(s.begin_suppress)].set(True)
        blocked = blocked | (first & (generated == 0))
    eos = tuple(e for e in s.eos if e < vocab)
    if eos and s.min_new_tokens > 0:
        early = jnp.zeros((vocab,), bool).at[jnp.asarray(eos)].set(True)
        blocked = blocked | (early & (generated < s.min_new_tokens))
    if s.suppress or s.begin_suppress or (eos and s.min_new_tokens > 0):
        logits = jnp.where(blocked, -jnp.inf, logits)
    return logits


def warp(logits: Array, s: GenerationSettings) -> Array:
    """The sampling warpers, as `transformers`: temperature, top-k, top-p, min-p.

    Arguments:
        logits: `(batch, vocab)` processed float32 logits.
        s: the generation's settings.

    Returns:
        The warped logits (removed tokens at minus infinity).
    """
    if s.temperature != 1.0:
        logits = logits / s.temperature
    if s.top_k is not None:
        logits = top_k_filter(logits, s.top_k)
    if s.top_p is not None:
        logits = top_p_filter(logits, s.top_p)
    if s.min_p is not None:
        logits = min_p_filter(logits, s.min_p)
    return logits


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
