"""`generate_seq2seq`: compiled decoding for the encoder-decoder models (T5, Whisper).

One `filter_jit`-compiled function does the whole generation: the encoder runs once, every
decoder layer's cross-attention keys and values are projected from its output once, the decoder
prompt fills the self-attention cache, then a `lax.while_loop` adds one token per step until
`max_new_tokens` or every row has produced an end-of-sequence token. It reads the model through
`Seq2SeqLM`'s contract only (`_seq2seq_parts.py`); token choice is `_sampling.choose`, and the
settings are checked as `generate`'s.
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
from treemod.models._causal_lm import KVCache
from treemod.models._generate import _Settings, _settings
from treemod.models._generation_config import GenerationSettings
from treemod.models._sampling import choose, process
from treemod.models._seq2seq_parts import Seq2SeqLM

__all__ = ["generate_seq2seq"]


def generate_seq2seq(
    model: Seq2SeqLM,
    input_ids: Any = None,
    *,
    max_new_tokens: int,
    attention_mask: Any = None,
    input_features: Any = None,
    decoder_input_ids: Any = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    suppress_tokens: Sequence[int] | None = None,
    begin_suppress_tokens: Sequence[int] | None = None,
    key: PRNGKeyArray | None = None,
) -> Array:
    """Decode up to `max_new_tokens` tokens for each input, as `transformers`' `generate`.

    Works with the encoder-decoder models of the zoo (`T5ForConditionalGeneration`,
    `WhisperForConditionalGeneration`: the subclasses of `Seq2SeqLM`). The encoder runs once
    over `input_ids` (with `attention_mask` 0 on padding) or `input_features`; the decoder
    starts from `decoder_input_ids` (default: the config's `decoder_start_token_id` for every
    row; for T5 a prompt not starting with it gets it put first, as `transformers` does) and
    adds one token per step with a self-attention cache and cross-attention keys computed
    once, all in one compiled function per input shape, prompt length, `max_new_tokens` and
    sampling settings. Decoding runs in inference mode (no dropout).

    Greedy decoding (`do_sample=False`) gives `transformers`' greedy tokens. Sampling applies
    `temperature`, `top_k`, `top_p` as `transformers`' warpers (no top-k unless asked), then
    draws with `key`. A row that produces an `eos_token_id` is finished: its later tokens are
    `pad_token_id` (default: the first end-of-sequence id), and generation stops early once
    every row is finished, returning a shorter array. `suppress_tokens` are never chosen and
    `begin_suppress_tokens` not as the first new token (`transformers`' `SuppressTokens*`
    processors; Whisper's checkpoints list them in `generation_config.json`). The config's
    and generation config's values are not read: the call gives them.

    Arguments:
        model: the encoder-decoder model.
        input_ids: `(batch, src_len)` encoder token ids (T5).
        max_new_tokens: the largest number of tokens to add.
        attention_mask: `(batch, src_len)`, 1 for tokens and 0 for padding.
        input_features: `(batch, num_mel_bins, frames)` log-mel features (Whisper).
        decoder_input_ids: `(batch, prompt_len)` or `(1, prompt_len)` decoder prompt ids.
        do_sample: sample instead of greedy decoding.
        temperature: divides the logits before sampling (positive).
        top_k: with sampling, keep only the `top_k` most likely tokens.
        top_p: with sampling, keep the most likely tokens up to probability `top_p` (0 to 1].
        eos_token_id: the end-of-sequence token id, or several.
        pad_token_id: the id written after a row's end of sequence.
        suppress_tokens: token ids never generated.
        begin_suppress_tokens: token ids not generated first.
        key: the PRNG key for sampling.

    Returns:
        `(batch, prompt_len + n)` int32 decoder ids: the prompt followed by
        `n <= max_new_tokens` new tokens.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5ForConditionalGeneration, generate_seq2seq
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        ...           "num_heads": 4, "decoder_start_token_id": 0}
        >>> model = T5ForConditionalGeneration.from_config(config, key=jax.random.key(0))
        >>> out = generate_seq2seq(model, jnp.array([[5, 6, 7], [0, 8, 9]]), max_new_tokens=4,
        ...                        attention_mask=jnp.array([[1, 1, 1], [0, 1, 1]]))
        >>> out.shape
        (2, 5)
    """
    if not isinstance(model, Seq2SeqLM):
        raise TypeError(
            f"generate_seq2seq: {type(model).__name__} is not an encoder-decoder model of "
            "treemod.models; pass a Seq2SeqLM (T5ForConditionalGeneration, "
            "WhisperForConditionalGeneration). Causal language models use generate."
        )
    owner = f"generate_seq2seq ({type(model).__name__})"
    given = {"input_ids": input_ids, "attention_mask": attention_mask}
    given["input_features"] = input_features
    extra = [n for n, x in given.items() if x is not None and n not in model.encoder_inputs]
    if extra:
        raise ValueError(
            f"{owner}: the model's encoder reads {', '.join(model.encoder_inputs)}; it does "
            f"not take {', '.join(extra)}."
        )
    inputs = model.encoder_arrays(owner, given)
    batch = next(iter(inputs.values())).shape[0]
    settings = _settings(
        owner, max_new_tokens, do_sample, temperature, top_k, top_p, eos_token_id, pad_token_id
    )
    if do_sample and key is None:
        raise ValueError(f"{owner}: sampling (do_sample=True) needs `key=` (a PRNG key).")
    suppress = _token_list(owner, "suppress_tokens", suppress_tokens)
    begin = _token_list(owner, "begin_suppress_tokens", begin_suppress_tokens)
    processing = dataclasses.replace(
        _PLAIN, eos=settings.eos, pad=settings.pad, suppress=suppress, begin_suppress=begin
    )
    prompt = _prompt(owner, model, decoder_input_ids, batch)
    limit = model.max_positions()
    if limit is not None and prompt.shape[1] + max_new_tokens > limit[1]:
        raise ValueError(
            f"{owner}: decoder prompt length {prompt.shape[1]} + max_new_tokens "
            f"{max_new_tokens} exceeds the config's {limit[0]}={limit[1]} (the decoder has no "
            "positions beyond it); shorten the prompt or max_new_tokens."
        )
    tokens, steps = _run(model, inputs, prompt, key, settings, processing)
    return tokens[:, : prompt.shape[1] + int(steps)]


# The processors generate_seq2seq applies: suppressed tokens only (set per call).
_PLAIN = GenerationSettings(
    max_new_tokens=1,
    min_new_tokens=0,
    do_sample=False,
    temperature=1.0,
    top_k=None,
    top_p=None,
    min_p=None,
    repetition_penalty=1.0,
    num_return_sequences=1,
    eos=(),
    pad=0,
    suppress=(),
    begin_suppress=(),
)


def _token_list(owner: str, name: str, ids: Any) -> tuple[int, ...]:
    if ids is None:
        return ()
    values = tuple(ids) if isinstance(ids, Sequence) else None
    if values is None or not all(
        isinstance(i, int | np.integer) and not isinstance(i, bool) and i >= 0 for i in values
    ):
        raise ValueError(f"{owner}: `{name}` must be a list of token ids (ints >= 0); got {ids!r}.")
    return tuple(int(i) for i in values)


def _prompt(owner: str, model: Seq2SeqLM, decoder_input_ids: Any, batch: int) -> Array:
    """The decoder prompt `(batch, prompt_len)`: given, or the start token, as `transformers`."""
    start = model.decoder_start_token_id()
    if decoder_input_ids is None:
        if start is None:
            raise ValueError(
                f"{owner}: the config names no decoder_start_token_id (nor bos_token_id); "
                "pass decoder_input_ids."
            )
        return jnp.full((batch, 1), start, jnp.int32)
    ids, _, _ = token_inputs(owner, decoder_input_ids, None, None)
    if ids.shape[0] not in (1, batch):
        raise ValueError(
            f"{owner}: decoder_input_ids has {ids.shape[0]} rows for a batch of {batch}; give "
            "one row per input, or one row for all."
        )
    ids = jnp.broadcast_to(ids, (batch, ids.shape[1])).astype(jnp.int32)
    if model.prepend_start and start is not None and bool(jnp.all(ids[:, 0] != start)):
        ids = jnp.concatenate([jnp.full((batch, 1), start, jnp.int32), ids], axis=1)
    return ids


@filter_jit
def _run(
    model: Seq2SeqLM,
    inputs: dict[str, Array],
    prompt: Array,
    key: PRNGKeyArray | None,
    s: _Settings,
    processing: GenerationSettings,
) -> tuple[Array, Array]:
    """Encode, prefill the decoder prompt, then the decoding loop; tokens and steps taken."""
    model = nn.inference_mode(model)  # at trace time: decoding drops nothing
    cross = model.cross_kv(model.encode(inputs))
    batch, prompt_len = prompt.shape
    max_len = prompt_len + s.max_new_tokens
    valid = jnp.zeros((batch, max_len), bool).at[:, :prompt_len].set(True)
    cache = KVCache.empty(model.cache_layout(), batch, max_len).at(jnp.int32(0), valid)
    positions = jnp.broadcast_to(jnp.arange(prompt_len, dtype=jnp.int32), prompt.shape)
    hidden, cache = model.decode(prompt, positions, cache, cross)
    logits = model.logits(hidden[:, -1]).astype(jnp.float32)
    tokens = jnp.zeros((batch, max_len), jnp.int32).at[:, :prompt_len].set(prompt)
    eos = jnp.asarray(s.eos, jnp.int32) if s.eos else None

    def pick(
        step: Array, tokens: Array, logits: Array, unfinished: Array, key: Any
    ) -> tuple[Array, Array, Array, Any]:
        sub = None
        if s.do_sample:
            key, sub = jax.random.split(key)
        token = choose(
            process(logits, processing, None, step),
            do_sample=s.do_sample,
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            key=sub,
        )
        if eos is not None:
            token = jnp.where(unfinished, token, s.pad)
            unfinished = unfinished & ~jnp.isin(token, eos)
        tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, prompt_len + step))
        return tokens, token, unfinished, key

    unfinished = jnp.ones((batch,), bool)
    tokens, token, unfinished, key = pick(jnp.int32(0), tokens, logits, unfinished, key)

    def cond(state: tuple[Any, ...]) -> Array:
        step: Array = state[0]
        return (step < s.max_new_tokens) & jnp.any(state[4])

    def body(state: tuple[Any, ...]) -> tuple[Any, ...]:
        step, tokens, cache, token, unfinished, key = state
        slot = prompt_len + step - 1
        valid = jnp.broadcast_to(jnp.arange(max_len) <= slot, (batch, max_len))
        position = jnp.full((batch, 1), slot, jnp.int32)
        hidden, cache = model.decode(token[:, None], position, cache.at(slot, valid), cross)
        logits = model.logits(hidden[:, -1]).astype(jnp.float32)
        tokens, token, unfinished, key = pick(step, tokens, logits, unfinished, key)
        return step + 1, tokens, cache, token, unfinished, key

    state = (jnp.int32(1), tokens, cache, token, unfinished, key)
    step, tokens, *_ = lax.while_loop(cond, body, state)
    return tokens, step
