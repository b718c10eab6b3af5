"""One step of decoding, shared by `generate` and `generate_seq2seq`: the next token of each row.

`Decoding` is what the compiled loop carries besides the model's cache: the token buffer (the
prompt, then the new tokens), which slots hold tokens, each new token's log-probability, which
rows are unfinished, the sampling keys, and the tokens seen (for the repetition penalty).
`choose_next` turns a step's logits into tokens: `transformers`' processors, then greedy or
sampling after its warpers, the end-of-sequence bookkeeping, and the streamer.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax

from treemod.models._generation_config import GenerationSettings
from treemod.models._sampling import process, warp

__all__ = ["Decoding", "choose_next", "running", "start_decoding"]


class Decoding(NamedTuple):
    """The loop's state besides the cache (see the module docstring)."""

    tokens: Array  # (batch, prompt_len + max_new_tokens) int32
    valid: Array  # (batch, prompt_len + max_new_tokens) bool
    scores: Array  # (batch, max_new_tokens) float32
    unfinished: Array  # (batch,) bool
    keys: Any  # None (greedy), one key, or one per row
    seen: Array | None  # (batch, vocab) bool, with a repetition penalty


def start_decoding(
    prompt: Array, mask: Array, keys: Any, s: GenerationSettings, vocab: int
) -> Decoding:
    """The state before the first new token.

    Arguments:
        prompt: `(batch, prompt_len)` int32 ids.
        mask: `(batch, prompt_len)` booleans, False on (left) padding.
        keys: the sampling key(s), or None.
        s: the settings.
        vocab: the logits' size.

    Returns:
        The state.
    """
    batch, prompt_len = prompt.shape
    max_len = prompt_len + s.max_new_tokens
    tokens = jnp.zeros((batch, max_len), jnp.int32).at[:, :prompt_len].set(prompt)
    valid = jnp.zeros((batch, max_len), bool).at[:, :prompt_len].set(mask)
    scores = jnp.zeros((batch, s.max_new_tokens), jnp.float32)
    seen = None
    if s.repetition_penalty != 1.0:
        # The prompts' tokens, their left padding left out (as transformers since 5.13).
        own = jnp.where(mask, prompt, vocab)
        rows = jnp.arange(batch)[:, None]
        seen = jnp.zeros((batch, vocab + 1), bool).at[rows, own].set(True)[:, :-1]
    return Decoding(tokens, valid, scores, jnp.ones((batch,), bool), keys, seen)


def choose_next(
    step: Array, state: Decoding, logits: Array, s: GenerationSettings, put: Any
) -> tuple[Decoding, Array]:
    """The `step`-th new token of every row from its logits, written into the state.

    Arguments:
        step: how many tokens each row has generated before this one (a scalar).
        state: the loop's state.
        logits: `(batch, vocab)` float32 logits.
        s: the settings.
        put: the streamer's `put`, or None.

    Returns:
        `(state, token)`: the new state and the `(batch,)` int32 tokens.
    """
    processed = process(logits, s, state.seen, step)
    keys = state.keys
    if s.do_sample:
        processed = warp(processed, s)
        if keys.ndim == 0:
            keys, sub = jax.random.split(keys)
            token = jax.random.categorical(sub, processed, axis=-1)
        else:  # one key per row: a row's draws do not depend on the rows beside it
            pairs = jax.vmap(jax.random.split)(keys)
            keys = pairs[:, 0]
            token = jax.vmap(jax.random.categorical)(pairs[:, 1], processed)
    else:
        token = jnp.argmax(processed, axis=-1)
    token = token.astype(jnp.int32)
    unfinished = state.unfinished
    if s.eos:
        token = jnp.where(unfinished, token, s.pad)
        unfinished = unfinished & ~jnp.isin(token, jnp.asarray(s.eos, jnp.int32))
    logprob = jnp.take_along_axis(jax.nn.log_softmax(processed), token[:, None], axis=-1)
    seen = state.seen
    if seen is not None:
        seen = seen.at[jnp.arange(token.shape[0]), token].set(True)
    if put is not None:
        jax.debug.callback(lambda t: put(np.asarray(t)), token, ordered=True)
    slot = state.tokens.shape[1] - s.max_new_tokens + step
    new = Decoding(
        tokens=lax.dynamic_update_slice(state.tokens, token[:, None], (0, slot)),
        valid=lax.dynamic_update_slice(state.valid, jnp.ones_like(token, bool)[:, None], (0, slot)),
        scores=lax.dynamic_update_slice(state.scores, logprob, (0, step)),
        unfinished=unfinished,
        keys=keys,
        seen=seen,
    )
    return new, token


def running(step: Array, state: Decoding, s: GenerationSettings) -> Array:
    """Whether the loop goes on: tokens left to make, and a row unfinished."""
    return (step < s.max_new_tokens) & jnp.any(state.unfinished)
