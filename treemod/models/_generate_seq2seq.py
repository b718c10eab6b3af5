"""`generate_seq2seq`: compiled decoding for the encoder-decoder models (T5, Whisper).

One `filter_jit`-compiled function does the whole generation: the encoder runs once, every
decoder layer's cross-attention keys and values are projected from its output once, the decoder
prompt fills the self-attention cache, then a `lax.while_loop` adds one token per step until
`max_new_tokens` or every row has produced an end-of-sequence token. It reads the model through
`Seq2SeqLM`'s contract only (`_seq2seq_parts.py`); token choice is `_sampling.choose`, and the
settings are checked as `generate`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._transforms.jit import filter_jit
from treemod.models._attention_parts import token_inputs
from treemod.models._causal_lm import KVCache
from treemod.models._decode_step import choose_next, running, start_decoding
from treemod.models._generate import GenerateOutput
from treemod.models._generate_inputs import sampling_keys, stream_put
from treemod.models._generation_config import (
    GenerationSettings,
    generation_settings,
    model_generation_config,
)
from treemod.models._seq2seq_parts import Seq2SeqLM

__all__ = ["generate_seq2seq"]


def generate_seq2seq(
    model: Seq2SeqLM,
    input_ids: Any = None,
    *,
    max_new_tokens: int | None = None,
    attention_mask: Any = None,
    input_features: Any = None,
    decoder_input_ids: Any = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    min_new_tokens: int | None = None,
    max_length: int | None = None,
    min_length: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    suppress_tokens: Sequence[int] | None = None,
    begin_suppress_tokens: Sequence[int] | None = None,
    generation_config: Mapping[str, Any] | None = None,
    output_scores: bool = False,
    streamer: Any = None,
    key: PRNGKeyArray | None = None,
) -> Array | GenerateOutput:
    """Decode up to `max_new_tokens` tokens for each input, as `transformers`' `generate`.

    Works with the encoder-decoder models of the zoo (`T5ForConditionalGeneration`,
    `WhisperForConditionalGeneration`: the subclasses of `Seq2SeqLM`). The encoder runs once
    over `input_ids` (with `attention_mask` 0 on padding) or `input_features`; the decoder
    starts from `decoder_input_ids` (default: the config's `decoder_start_token_id` for every
    row; for T5 a prompt not starting with it gets it put first, as `transformers` does) and
    adds one token per step with a self-attention cache and cross-attention keys computed
    once, all in one compiled function per input shape, prompt length, `max_new_tokens` and
    sampling settings. Decoding runs in inference mode (no dropout).

    Every generation value resolves as `generate`'s (the call, then the model's generation
    config, then `transformers`' defaults) and goes through the same processors and warpers,
    end-of-sequence handling, scores and streamer. A checkpoint's `forced_decoder_ids`
    (Whisper's language and task tokens) become the decoder prompt after the start token
    when no `decoder_input_ids` are given, as `transformers`' Whisper does. A row that
    produces an end-of-sequence id is finished: its later tokens are the pad id, and
    generation stops early once every row is finished, returning a shorter array.

    Arguments:
        model: the encoder-decoder model.
        input_ids: `(batch, src_len)` encoder token ids (T5).
        max_new_tokens: the largest number of tokens to add.
        attention_mask: `(batch, src_len)`, 1 for tokens and 0 for padding.
        input_features: `(batch, num_mel_bins, frames)` log-mel features (Whisper).
        decoder_input_ids: `(batch, prompt_len)` or `(1, prompt_len)` decoder prompt ids.
        do_sample: as `generate`'s.
        temperature: as `generate`'s.
        top_k: as `generate`'s.
        top_p: as `generate`'s.
        min_p: as `generate`'s.
        repetition_penalty: as `generate`'s.
        min_new_tokens: as `generate`'s.
        max_length: as `generate`'s.
        min_length: as `generate`'s.
        eos_token_id: as `generate`'s.
        pad_token_id: as `generate`'s.
        suppress_tokens: as `generate`'s.
        begin_suppress_tokens: as `generate`'s.
        generation_config: as `generate`'s.
        output_scores: as `generate`'s.
        streamer: as `generate`'s.
        key: as `generate`'s.

    Returns:
        `(batch, prompt_len + n)` int32 decoder ids: the prompt followed by
        `n <= max_new_tokens` new tokens; with `output_scores`, a `GenerateOutput`.

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
    config = (
        model_generation_config(model.config)
        if generation_config is None
        else dict(generation_config)
    )
    forced = config.pop("forced_decoder_ids", None)
    prompt = _prompt(owner, model, decoder_input_ids, batch, forced)
    call = {
        "max_new_tokens": max_new_tokens,
        "max_length": max_length,
        "min_new_tokens": min_new_tokens,
        "min_length": min_length,
        "do_sample": do_sample,
        "temperature": temperature,
        "top_k": top_k,
        "top_p": top_p,
        "min_p": min_p,
        "repetition_penalty": repetition_penalty,
        "num_return_sequences": None,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "suppress_tokens": suppress_tokens,
        "begin_suppress_tokens": begin_suppress_tokens,
    }
    vocab = int(model.config["vocab_size"])
    s = generation_settings(
        owner,
        model.config,
        call,
        generation_config=config,
        prompt_len=prompt.shape[1],
        vocab_size=vocab,
    )
    limit = model.max_positions()
    if limit is not None and prompt.shape[1] + s.max_new_tokens > limit[1]:
        raise ValueError(
            f"{owner}: decoder prompt length {prompt.shape[1]} + max_new_tokens "
            f"{s.max_new_tokens} exceeds the config's {limit[0]}={limit[1]} (the decoder has no "
            "positions beyond it); shorten the prompt or max_new_tokens."
        )
    keys = sampling_keys(owner, key, s, batch)
    put = stream_put(owner, streamer)
    if put is not None:
        put(np.asarray(prompt))
    tokens, scores, steps = _run(model, inputs, prompt, keys, s, put, vocab)
    if put is not None:
        streamer.end()
    sequences = tokens[:, : prompt.shape[1] + int(steps)]
    return GenerateOutput(sequences, scores[:, : int(steps)]) if output_scores else sequences


def _prompt(owner: str, model: Seq2SeqLM, decoder_input_ids: Any, batch: int, forced: Any) -> Array:
    """The decoder prompt `(batch, prompt_len)`: given, or the start token followed by the
    generation config's forced ids, as `transformers`."""
    start = model.decoder_start_token_id()
    if decoder_input_ids is None:
        if start is None:
            raise ValueError(
                f"{owner}: the config names no decoder_start_token_id (nor bos_token_id); "
                "pass decoder_input_ids."
            )
        return jnp.asarray([[start, *_forced(owner, forced)]] * batch, jnp.int32)
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


def _forced(owner: str, forced: Any) -> list[int]:
    """The ids of `forced_decoder_ids` (`[[1, id], [2, id], ...]`, positions after the start)."""
    if forced is None:
        return []
    pairs = list(forced) if isinstance(forced, list | tuple) else None
    ok = pairs is not None and all(
        isinstance(p, list | tuple) and len(p) == 2 and p[0] == i + 1 and isinstance(p[1], int)
        for i, p in enumerate(pairs)
    )
    if not ok:
        raise ValueError(
            f"{owner}: the generation config's forced_decoder_ids is {forced!r}; treemod reads "
            "[[1, id], [2, id], ...] (the ids after the start token); pass decoder_input_ids."
        )
    return [int(p[1]) for p in pairs]  # type: ignore[union-attr]


@filter_jit
def _run(
    model: Seq2SeqLM,
    inputs: dict[str, Array],
    prompt: Array,
    keys: PRNGKeyArray | None,
    s: GenerationSettings,
    put: Any,
    vocab: int,
) -> tuple[Array, Array, Array]:
    """Encode, prefill the decoder prompt, then the decoding loop; the token buffer, the new
    tokens' scores and the steps taken."""
    model = nn.inference_mode(model)  # at trace time: decoding drops nothing
    cross = model.cross_kv(model.encode(inputs))
    batch, prompt_len = prompt.shape
    max_len = prompt_len + s.max_new_tokens
    state = start_decoding(prompt, jnp.ones(prompt.shape, bool), keys, s, vocab)
    cache = KVCache.empty(model.cache_layout(), batch, max_len).at(jnp.int32(0), state.valid)
    positions = jnp.broadcast_to(jnp.arange(prompt_len, dtype=jnp.int32), prompt.shape)
    hidden, cache = model.decode(prompt, positions, cache, cross)
    logits = model.logits(hidden[:, -1]).astype(jnp.float32)
    state, token = choose_next(jnp.int32(0), state, logits, s, put)

    def cond(loop: tuple[Any, ...]) -> Array:
        return running(loop[0], loop[1], s)

    def body(loop: tuple[Any, ...]) -> tuple[Any, ...]:
        step, state, cache, token = loop
        slot = prompt_len + step - 1
        position = jnp.full((batch, 1), slot, jnp.int32)
        hidden, cache = model.decode(token[:, None], position, cache.at(slot, state.valid), cross)
        logits = model.logits(hidden[:, -1]).astype(jnp.float32)
        state, token = choose_next(step, state, logits, s, put)
        return step + 1, state, cache, token

    step, state, *_ = lax.while_loop(cond, body, (jnp.int32(1), state, cache, token))
    return state.tokens, state.scores, step
