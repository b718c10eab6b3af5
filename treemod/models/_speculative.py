"""Speculative (assisted) greedy decoding: a small draft model proposes, the model verifies.

Each round the draft model proposes `k` tokens greedily, one at a time with its own cache;
the model then runs once over its last token and the `k` proposals and takes, from its own
greedy choices at those `k + 1` positions, the proposals up to the first it disagrees with,
plus its own next token. The tokens are the model's greedy tokens whatever the draft says; a
draft that agrees often saves the model's one-token steps. Both caches keep every accepted
token; slots past the accepted ones are masked out and written over in the next round. The
whole generation is one compiled `lax.while_loop`, as `generate`'s.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax.numpy as jnp
from jax import Array, lax

import treemod.nn as nn
from treemod._transforms.jit import filter_jit
from treemod.models._causal_lm import CausalLM, KVCache, cached_logits
from treemod.models._generation_config import GenerationSettings

__all__ = ["SpeculativeStats", "speculative_decode"]


class SpeculativeStats(NamedTuple):
    """How the draft fared: rounds run and draft tokens accepted (int32 scalars)."""

    rounds: Array
    accepted: Array


def _vocab(model: CausalLM) -> int:
    parts = model.lm_parts()
    return int((parts.token_embedding if parts.lm_head is None else parts.lm_head).weight.shape[0])


def check_assistant(
    owner: str, model: CausalLM, draft: Any, s: GenerationSettings, ids: Any
) -> None:
    """Refuse, by name, what speculative decoding does not do."""
    if not isinstance(draft, CausalLM):
        raise TypeError(
            f"{owner}: `assistant_model` must be a causal LM of treemod.models (a CausalLM); got "
            f"{type(draft).__name__}."
        )
    if _vocab(draft) != _vocab(model):
        raise ValueError(
            f"{owner}: `assistant_model` has a vocabulary of {_vocab(draft)} tokens and the model "
            f"{_vocab(model)}: the draft must share the model's tokenizer."
        )
    unsupported = {
        "do_sample": s.do_sample,
        "repetition_penalty": s.repetition_penalty != 1.0,
        "min_new_tokens": s.min_new_tokens > 0,
        "suppress_tokens": bool(s.suppress or s.begin_suppress),
    }
    used = [name for name, on in unsupported.items() if on]
    if used:
        raise ValueError(
            f"{owner}: with `assistant_model`, decoding is greedy without processors; "
            f"{', '.join(used)} cannot be used with it."
        )
    if ids.shape[0] != 1 or ids.shape[1] < 2:
        raise ValueError(
            f"{owner}: with `assistant_model`, give one prompt of at least 2 tokens (as "
            f"transformers' assisted generation, one row); got input_ids of shape "
            f"{list(ids.shape)}."
        )


@filter_jit
def speculative_decode(
    model: CausalLM, draft: CausalLM, ids: Array, s: GenerationSettings, k: int
) -> tuple[Array, Array, SpeculativeStats]:
    """Greedy tokens of `model` after the prompt `ids` `(1, prompt_len)`, with `draft`'s
    proposals of `k` tokens a round (see the module docstring).

    Arguments:
        model: the model whose greedy tokens are returned.
        draft: the draft model (same vocabulary).
        ids: the prompt, one row of at least 2 tokens, no padding.
        s: the settings (greedy; `max_new_tokens`, end-of-sequence ids).
        k: draft tokens per round.

    Returns:
        `(tokens, length, stats)`: the buffer, the number of its tokens that are the result
        (prompt included), and the draft's statistics.
    """
    model, draft = nn.inference_mode(model), nn.inference_mode(draft)
    prompt_len = ids.shape[1]
    limit = prompt_len + s.max_new_tokens
    size = limit + k + 1  # room for a round's overshoot
    tokens = jnp.zeros((1, size), jnp.int32).at[:, :prompt_len].set(ids)
    slots = jnp.arange(size)
    caches = []
    for m in (model, draft):  # both hold the prompt but its last token
        cache = KVCache.empty(m.lm_parts().decoder.cache_layout(), 1, size)
        valid = (slots < prompt_len - 1)[None]
        positions = jnp.arange(prompt_len - 1, dtype=jnp.int32)[None]
        _, cache = cached_logits(m, ids[:, :-1], positions, cache.at(jnp.int32(0), valid))
        caches.append(cache)
    eos = jnp.asarray(s.eos or (-1,), jnp.int32)

    def propose(n: Array, tokens: Array, cache: KVCache) -> tuple[Array, KVCache]:
        # The last two tokens (the one before may be a proposal the draft never read).
        pair = lax.dynamic_slice(tokens, (0, n - 2), (1, 2))
        positions = (n - 2 + jnp.arange(2, dtype=jnp.int32))[None]
        logits, cache = cached_logits(draft, pair, positions, cache.at(n - 2, (slots < n)[None]))
        first = jnp.argmax(logits, axis=-1).astype(jnp.int32)

        def one(i: Array, carry: tuple[Array, KVCache, Array]) -> tuple[Array, KVCache, Array]:
            out, cache, last = carry
            slot = n - 1 + i
            at = cache.at(slot, (slots <= slot)[None])
            logits, cache = cached_logits(draft, last[:, None], slot[None, None], at)
            token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
            return out.at[i].set(token[0]), cache, token

        out = jnp.zeros((k,), jnp.int32).at[0].set(first[0])
        out, cache, _ = lax.fori_loop(1, k, one, (out, cache, first))
        return out, cache

    def body(loop: tuple[Any, ...]) -> tuple[Any, ...]:
        n, tokens, target, small, done, rounds, accepted = loop
        proposals, small = propose(n, tokens, small)
        last = lax.dynamic_slice(tokens, (0, n - 1), (1, 1))
        chunk = jnp.concatenate([last, proposals[None]], axis=1)
        positions = (n - 1 + jnp.arange(k + 1, dtype=jnp.int32))[None]
        at = target.at(n - 1, (slots < n + k)[None])
        hidden, target = model.lm_parts().decoder.decode(chunk, positions, at)
        choices = jnp.argmax(model.logits(hidden)[0], axis=-1).astype(jnp.int32)  # (k + 1,)
        agree = jnp.cumprod((proposals == choices[:k]).astype(jnp.int32))
        m = jnp.sum(agree)
        new = jnp.where(jnp.arange(k + 1) < m, jnp.append(proposals, 0), choices)
        # An end of sequence among the m + 1 new tokens ends the generation after it.
        stop = jnp.isin(new, eos) & (jnp.arange(k + 1) <= m)
        count = jnp.where(jnp.any(stop), jnp.argmax(stop) + 1, m + 1)
        tokens = lax.dynamic_update_slice(tokens, new[None], (0, n))
        return (
            n + count,
            tokens,
            target,
            small,
            done | jnp.any(stop),
            rounds + 1,
            accepted + jnp.minimum(m, count),
        )

    def cond(loop: tuple[Any, ...]) -> Array:
        n: Array = loop[0]
        done: Array = loop[4]
        return (n < limit) & ~done

    zero = jnp.int32(0)
    start = (jnp.int32(prompt_len), tokens, caches[0], caches[1], jnp.bool_(False), zero, zero)
    n, tokens, _, _, _, rounds, accepted = lax.while_loop(cond, body, start)
    return tokens, jnp.minimum(n, limit), SpeculativeStats(rounds, accepted)
