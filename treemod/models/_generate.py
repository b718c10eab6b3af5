"""`generate`: compiled key-value-cache decoding for the causal language models.

One `filter_jit`-compiled function does the whole generation: the prompt's forward pass fills
the cache (prefill), then a `lax.while_loop` adds one token per step until `max_new_tokens` or
every row has produced an end-of-sequence token. It is traced once per batch size, prompt
length, `max_new_tokens` and sampling settings; the loop never retraces per token. It reads
the model through `CausalLM`'s contract only (`_causal_lm.py`): any subclass generates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._transforms.jit import filter_jit
from treemod.models._attention_parts import token_inputs
from treemod.models._causal_lm import CausalLM, KVCache, cached_logits
from treemod.models._sampling import choose

__all__ = ["generate"]


@dataclasses.dataclass(frozen=True)
class _Settings:
    max_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    eos: tuple[int, ...]
    pad: int


def generate(
    model: CausalLM,
    input_ids: Any,
    *,
    max_new_tokens: int,
    attention_mask: Any = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    key: PRNGKeyArray | None = None,
) -> Array:
    """Continue each prompt by up to `max_new_tokens` tokens, as `transformers`' `generate`.

    Works with every causal language model of the zoo (`GPT2LMHeadModel`, `LlamaForCausalLM`,
    `MistralForCausalLM`, `Qwen2ForCausalLM`: the subclasses of `CausalLM`). Prompts of
    different lengths go in one batch left-padded, with `attention_mask` 0 on the padding;
    position ids come from the mask (`cumsum(mask) - 1`) as in `transformers`. A key-value
    cache of `prompt + max_new_tokens` slots is filled by one forward pass over the prompts,
    then one token is added per step in a compiled loop: the whole call is compiled once per
    batch size, prompt length, `max_new_tokens` and sampling settings. Decoding runs in
    inference mode (no dropout).

    Greedy decoding (`do_sample=False`) takes the most likely token, giving `transformers`'
    greedy tokens. Sampling applies, in `transformers`' order, `temperature`, `top_k` (keep the
    k most likely tokens) and `top_p` (keep the most likely tokens whose probabilities sum to
    `top_p`), then draws with `key`. Unlike `transformers`' default generation config, no
    top-k is applied unless asked for. A row that produces an `eos_token_id` is finished: its
    later tokens are `pad_token_id` (default: the first end-of-sequence id), and generation
    stops early once every row is finished, returning a shorter array.

    Arguments:
        model: the language model.
        input_ids: `(batch, prompt_len)` integer token ids (NumPy or JAX).
        max_new_tokens: the largest number of tokens to add.
        attention_mask: `(batch, prompt_len)`, 1 for tokens and 0 for (left) padding.
        do_sample: sample instead of greedy decoding.
        temperature: divides the logits before sampling (positive).
        top_k: with sampling, keep only the `top_k` most likely tokens.
        top_p: with sampling, keep the most likely tokens up to probability `top_p` (0 to 1].
        eos_token_id: the end-of-sequence token id, or several.
        pad_token_id: the id written after a row's end of sequence.
        key: the PRNG key for sampling.

    Returns:
        `(batch, prompt_len + n)` int32 ids, the prompts followed by `n <= max_new_tokens`
        new tokens.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import GPT2LMHeadModel, generate
        >>> config = {"n_embd": 32, "n_layer": 2, "n_head": 4, "vocab_size": 100}
        >>> model = GPT2LMHeadModel.from_config(config, key=jax.random.key(0))
        >>> out = generate(model, jnp.array([[0, 5, 6], [1, 2, 3]]), max_new_tokens=4,
        ...                attention_mask=jnp.array([[0, 1, 1], [1, 1, 1]]))
        >>> out.shape
        (2, 7)
    """
    if not isinstance(model, CausalLM):
        raise TypeError(
            f"generate: {type(model).__name__} is not a causal language model of "
            "treemod.models; pass a CausalLM: GPT2LMHeadModel or a Llama-family *ForCausalLM "
            "(LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)."
        )
    owner = f"generate ({type(model).__name__})"
    ids, mask, _ = token_inputs(owner, input_ids, attention_mask, None)
    settings = _settings(
        owner, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id
    )
    if do_sample and key is None:
        raise ValueError(f"{owner}: sampling (do_sample=True) needs `key=` (a PRNG key).")
    limit = model.max_positions()
    if limit is not None and ids.shape[1] + max_new_tokens > limit[1]:
        raise ValueError(
            f"{owner}: prompt length {ids.shape[1]} + max_new_tokens {max_new_tokens} "
            f"exceeds the config's {limit[0]}={limit[1]} (the model has no positions beyond "
            "it); shorten the prompt or max_new_tokens."
        )
    if mask is None:
        mask = jnp.ones(ids.shape, bool)
    tokens, steps = _run(model, ids.astype(jnp.int32), mask, key, settings)
    return tokens[:, : ids.shape[1] + int(steps)]


def _settings(
    owner: str,
    max_new_tokens: Any,
    do_sample: Any,
    temperature: Any,
    top_k: Any,
    top_p: Any,
    eos_token_id: Any,
    pad_token_id: Any,
) -> _Settings:
    def integer(x: Any) -> bool:
        return isinstance(x, int | np.integer) and not isinstance(x, bool)

    if not integer(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(
            f"{owner}: `max_new_tokens` must be a positive int; got {max_new_tokens!r}."
        )
    if not isinstance(temperature, int | float) or not temperature > 0:
        raise ValueError(
            f"{owner}: `temperature` must be a positive number; got {temperature!r} "
            "(for greedy decoding pass do_sample=False)."
        )
    if top_k is not None and (not integer(top_k) or top_k < 1):
        raise ValueError(f"{owner}: `top_k` must be None or an int >= 1; got {top_k!r}.")
    if top_p is not None and (not isinstance(top_p, int | float) or not 0 < top_p <= 1):
        raise ValueError(f"{owner}: `top_p` must be None or in (0, 1]; got {top_p!r}.")
    eos: tuple[int, ...] = ()
    if eos_token_id is not None:
        eos = (eos_token_id,) if integer(eos_token_id) else tuple(eos_token_id)
        if not eos or not all(integer(e) for e in eos):
            raise ValueError(
                f"{owner}: `eos_token_id` must be an int or a sequence of ints; got "
                f"{eos_token_id!r}."
            )
    if pad_token_id is not None and not integer(pad_token_id):
        raise ValueError(f"{owner}: `pad_token_id` must be an int; got {pad_token_id!r}.")
    pad = pad_token_id if pad_token_id is not None else (eos[0] if eos else 0)
    return _Settings(
        max_new_tokens=int(max_new_tokens),
        do_sample=bool(do_sample),
        temperature=float(temperature),
        top_k=None if top_k is None else int(top_k),
        top_p=None if top_p is None else float(top_p),
        eos=tuple(int(e) for e in eos),
        pad=int(pad),
    )


@filter_jit
def _run(
    model: CausalLM, ids: Array, mask: Array, key: PRNGKeyArray | None, s: _Settings
) -> tuple[Array, Array]:
    """Prefill, then the decoding loop; returns the token buffer and the steps taken."""
    model = nn.inference_mode(model)  # at trace time: decoding drops nothing
    batch, prompt_len = ids.shape
    max_len = prompt_len + s.max_new_tokens
    positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 1).astype(jnp.int32)
    valid = jnp.zeros((batch, max_len), bool).at[:, :prompt_len].set(mask)
    layout = model.lm_parts().decoder.cache_layout()
    cache = KVCache.empty(layout, batch, max_len).at(jnp.int32(0), valid)
    logits, cache = cached_logits(model, ids, positions, cache)
    tokens = jnp.zeros((batch, max_len), jnp.int32).at[:, :prompt_len].set(ids)
    eos = jnp.asarray(s.eos, jnp.int32) if s.eos else None

    def pick(
        step: Array, tokens: Array, valid: Array, logits: Array, unfinished: Array, key: Any
    ) -> tuple[Array, Array, Array, Array, Any]:
        sub = None
        if s.do_sample:
            key, sub = jax.random.split(key)
        token = choose(
            logits,
            do_sample=s.do_sample,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            key=sub,
        )
        if eos is not None:
            token = jnp.where(unfinished, token, s.pad)
            unfinished = unfinished & ~jnp.isin(token, eos)
        slot = prompt_len + step
        tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, slot))
        valid = lax.dynamic_update_slice(valid, jnp.ones((batch, 1), bool), (0, slot))
        return tokens, valid, token, unfinished, key

    # The new token's position: the number of real tokens before it.
    position = jnp.sum(mask, axis=1, dtype=jnp.int32)
    unfinished = jnp.ones((batch,), bool)
    tokens, valid, token, unfinished, key = pick(
        jnp.int32(0), tokens, valid, logits, unfinished, key
    )

    def cond(state: tuple[Any, ...]) -> Array:
        step: Array = state[0]
        return (step < s.max_new_tokens) & jnp.any(state[5])

    def body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        step, tokens, valid, cache, token, unfinished, position, key = state
        offset = prompt_len + step - 1
        new, pos = token[:, None], position[:, None]
        logits, cache = cached_logits(model, new, pos, cache.at(offset, valid))
        tokens, valid, token, unfinished, key = pick(step, tokens, valid, logits, unfinished, key)
        return step + 1, tokens, valid, cache, token, unfinished, position + 1, key

    state = (jnp.int32(1), tokens, valid, cache, token, unfinished, position, key)
    step, tokens, *_ = lax.while_loop(cond, body, state)
    return tokens, step
