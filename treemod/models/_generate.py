"""`generate`: compiled key-value-cache decoding for the causal language models.

One `filter_jit`-compiled function does the whole generation: the prompt's forward pass fills
the cache (prefill), then a `lax.while_loop` adds one token per step until `max_new_tokens` or
every row has produced an end-of-sequence token. It is traced once per batch size, prompt
length (or length bucket: `pad_to_multiple_of`), `max_new_tokens` and settings; the loop never
retraces per token. It reads the model through `CausalLM`'s contract only (`_causal_lm.py`):
any subclass generates. Its values resolve as `transformers`' do (`_generation_config.py`) and
its logits go through `transformers`' processors (`_sampling.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, NamedTuple, overload

import jax.numpy as jnp
import numpy as np
from jax import Array, lax
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._transforms.jit import filter_jit
from treemod.models._causal_lm import CausalLM, KVCache, cached_logits
from treemod.models._decode_step import choose_next, running, start_decoding
from treemod.models._generate_inputs import (
    bucket_padding,
    prompt_arrays,
    sampling_keys,
    stream_put,
)
from treemod.models._generation_config import GenerationSettings, generation_settings
from treemod.models._speculative import check_assistant, speculative_decode

__all__ = ["GenerateOutput", "generate"]


class GenerateOutput(NamedTuple):
    """`generate(..., output_scores=True)`'s result.

    Attributes:
        sequences: `(batch, prompt_len + n)` int32 ids, as `generate` returns them.
        scores: `(batch, n)` float32, the log-probability of each new token under the processed
            (and, when sampling, warped) distribution it was chosen from: `transformers`'
            `compute_transition_scores(..., normalize_logits=True)`.
    """

    sequences: Array
    scores: Array


@overload
def generate(
    model: CausalLM,
    input_ids: Any,
    *,
    max_new_tokens: int | None = ...,
    attention_mask: Any = ...,
    do_sample: bool | None = ...,
    temperature: float | None = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    min_p: float | None = ...,
    repetition_penalty: float | None = ...,
    min_new_tokens: int | None = ...,
    num_return_sequences: int | None = ...,
    max_length: int | None = ...,
    min_length: int | None = ...,
    eos_token_id: int | Sequence[int] | None = ...,
    pad_token_id: int | None = ...,
    suppress_tokens: Sequence[int] | None = ...,
    begin_suppress_tokens: Sequence[int] | None = ...,
    generation_config: Mapping[str, Any] | None = ...,
    pad_to_multiple_of: int | None = ...,
    output_scores: Literal[False] = ...,
    streamer: Any = ...,
    key: PRNGKeyArray | None = ...,
    assistant_model: CausalLM | None = ...,
    num_assistant_tokens: int = ...,
) -> Array: ...


@overload
def generate(
    model: CausalLM,
    input_ids: Any,
    *,
    max_new_tokens: int | None = ...,
    attention_mask: Any = ...,
    do_sample: bool | None = ...,
    temperature: float | None = ...,
    top_k: int | None = ...,
    top_p: float | None = ...,
    min_p: float | None = ...,
    repetition_penalty: float | None = ...,
    min_new_tokens: int | None = ...,
    num_return_sequences: int | None = ...,
    max_length: int | None = ...,
    min_length: int | None = ...,
    eos_token_id: int | Sequence[int] | None = ...,
    pad_token_id: int | None = ...,
    suppress_tokens: Sequence[int] | None = ...,
    begin_suppress_tokens: Sequence[int] | None = ...,
    generation_config: Mapping[str, Any] | None = ...,
    pad_to_multiple_of: int | None = ...,
    output_scores: Literal[True],
    streamer: Any = ...,
    key: PRNGKeyArray | None = ...,
    assistant_model: CausalLM | None = ...,
    num_assistant_tokens: int = ...,
) -> GenerateOutput: ...


def generate(
    model: CausalLM,
    input_ids: Any,
    *,
    max_new_tokens: int | None = None,
    attention_mask: Any = None,
    do_sample: bool | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    min_new_tokens: int | None = None,
    num_return_sequences: int | None = None,
    max_length: int | None = None,
    min_length: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    pad_token_id: int | None = None,
    suppress_tokens: Sequence[int] | None = None,
    begin_suppress_tokens: Sequence[int] | None = None,
    generation_config: Mapping[str, Any] | None = None,
    pad_to_multiple_of: int | None = None,
    output_scores: bool = False,
    streamer: Any = None,
    key: PRNGKeyArray | None = None,
    assistant_model: CausalLM | None = None,
    num_assistant_tokens: int = 5,
) -> Array | GenerateOutput:
    """Continue each prompt by up to `max_new_tokens` tokens, as `transformers`' `generate`.

    Works with every causal language model of the zoo (the subclasses of `CausalLM`). Each
    value not given comes, as in `transformers`, from the model's generation config (the
    checkpoint's `generation_config.json`, else the token ids of its `config.json`: its
    end-of-sequence ids stop generation), else from `transformers`' defaults (`max_length`
    20, `top_k` 50 when sampling). Values of that config treemod does not implement (beam
    search, ...) are refused by name; `generation_config={}` decodes without them.

    Prompts of different lengths go in one batch left-padded, with `attention_mask` 0 on the
    padding (right padding is refused: the model would continue from the padding); position
    ids come from the mask as in `transformers`. A key-value cache of `prompt +
    max_new_tokens` slots is filled by one forward pass, then one token is added per step in
    a compiled loop. The call compiles once per batch size, prompt length and settings:
    `pad_to_multiple_of=64` left-pads prompts to a multiple of 64 tokens so that one
    compilation serves every length in the bucket, with the same tokens. Decoding runs in
    inference mode (no dropout).

    Greedy decoding (`do_sample=False`) takes the most likely token after the processors
    (`repetition_penalty`, `min_new_tokens`, suppressed tokens), giving `transformers`' greedy
    tokens. Sampling then applies `temperature`, `top_k`, `top_p` and `min_p` and draws with
    `key`: one key for the batch, or one key per row (`(batch * num_return_sequences,)` keys,
    e.g. `jax.random.split`), so that a row's tokens do not depend on the rows beside it. A
    row that produces an end-of-sequence id is finished: its later tokens are
    `pad_token_id` (default: the first end-of-sequence id), and generation stops once every
    row is finished, returning a shorter array.

    Arguments:
        model: the language model.
        input_ids: `(batch, prompt_len)` integer token ids (NumPy or JAX), each below the
            vocabulary size.
        max_new_tokens: the largest number of tokens to add (else from `max_length`).
        attention_mask: `(batch, prompt_len)`, 1 for tokens and 0 for (left) padding.
        do_sample: sample instead of greedy decoding.
        temperature: with sampling, divides the logits (positive; greedy ignores it).
        top_k: with sampling, keep only the `top_k` most likely tokens (0: all).
        top_p: with sampling, keep the most likely tokens up to probability `top_p` (0 to 1].
        min_p: with sampling, keep the tokens at least `min_p` times as likely as the top one.
        repetition_penalty: divides the positive logits (multiplies the negative ones) of the
            tokens already in the row (1: none).
        min_new_tokens: no end of sequence before this many new tokens.
        num_return_sequences: sequences per prompt (sampling), as consecutive rows.
        max_length: prompt plus new tokens, when `max_new_tokens` is not given.
        min_length: prompt plus new tokens before an end of sequence may come.
        eos_token_id: the end-of-sequence token id, or several.
        pad_token_id: the id written after a row's end of sequence.
        suppress_tokens: ids never generated; `begin_suppress_tokens`: ids not generated first.
        generation_config: a dict that replaces the model's generation config.
        pad_to_multiple_of: left-pad the prompts to a multiple of this many tokens (one
            compilation per bucket); the result is as without it.
        output_scores: also return each new token's log-probability (`GenerateOutput`).
        streamer: an object with `put(ids)` and `end()` (`transformers`' `TextStreamer`
            works): `put` receives the prompts `(batch, prompt_len)`, then each step's new
            tokens `(batch,)` as NumPy arrays while the loop runs; `end()` at the end.
        key: the PRNG key (or keys, one per row) for sampling.
        assistant_model: a small causal LM of the same vocabulary for speculative greedy
            decoding (one prompt, no processors): it proposes `num_assistant_tokens` tokens a
            round, the model checks them in one pass; the tokens are the model's own greedy
            tokens, fewer passes of the model when the draft agrees.
        num_assistant_tokens: the draft's tokens per round.

    Returns:
        `(batch * num_return_sequences, prompt_len + n)` int32 ids, the prompts followed by
        `n <= max_new_tokens` new tokens; with `output_scores`, a `GenerateOutput`.

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
            "treemod.models; pass a CausalLM (GPT2LMHeadModel, LlamaForCausalLM, ...: the "
            "classes whose transformers twin generates)."
        )
    owner = f"generate ({type(model).__name__})"
    parts = model.lm_parts()
    vocab = int(parts.token_embedding.weight.shape[0])
    ids, mask = prompt_arrays(owner, input_ids, attention_mask, vocab)
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
        "num_return_sequences": num_return_sequences,
        "eos_token_id": eos_token_id,
        "pad_token_id": pad_token_id,
        "suppress_tokens": suppress_tokens,
        "begin_suppress_tokens": begin_suppress_tokens,
    }
    s = generation_settings(
        owner,
        model.config,
        call,
        generation_config=generation_config,
        prompt_len=ids.shape[1],
        vocab_size=vocab,
    )
    limit = model.max_positions()
    if limit is not None and ids.shape[1] + s.max_new_tokens > limit[1]:
        raise ValueError(
            f"{owner}: prompt length {ids.shape[1]} + max_new_tokens {s.max_new_tokens} "
            f"exceeds the config's {limit[0]}={limit[1]} (the model has no positions beyond "
            "it); shorten the prompt or max_new_tokens."
        )
    if assistant_model is not None:
        return _assisted(
            owner,
            model,
            assistant_model,
            ids,
            mask,
            s,
            num_assistant_tokens,
            output_scores or streamer is not None or pad_to_multiple_of is not None,
        )
    rows = ids.shape[0] * s.num_return_sequences
    keys = sampling_keys(owner, key, s, rows)
    if s.num_return_sequences > 1:
        ids = np.repeat(ids, s.num_return_sequences, axis=0)
        mask = np.repeat(mask, s.num_return_sequences, axis=0)
    width = ids.shape[1]
    extra = bucket_padding(owner, width, pad_to_multiple_of)
    if extra:
        ids = np.concatenate([np.full((rows, extra), s.pad, ids.dtype), ids], axis=1)
        mask = np.concatenate([np.zeros((rows, extra), bool), mask], axis=1)
    put = stream_put(owner, streamer)
    if put is not None:
        put(ids[:, extra:])
    tokens, scores, steps = _run(model, jnp.asarray(ids), jnp.asarray(mask), keys, s, put)
    if put is not None:
        streamer.end()
    sequences = tokens[:, extra : width + extra + int(steps)]
    if output_scores:
        return GenerateOutput(sequences, scores[:, : int(steps)])
    return sequences


def _assisted(
    owner: str,
    model: CausalLM,
    draft: Any,
    ids: Any,
    mask: Any,
    s: GenerationSettings,
    k: Any,
    other_options: bool,
) -> Array:
    check_assistant(owner, model, draft, s, ids)
    if not bool(np.all(mask)) or other_options:
        raise ValueError(
            f"{owner}: with `assistant_model`, give one unpadded prompt, without output_scores, "
            "streamer or pad_to_multiple_of."
        )
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"{owner}: `num_assistant_tokens` must be an int >= 1; got {k!r}.")
    tokens, length, _ = speculative_decode(model, draft, jnp.asarray(ids), s, k)
    return tokens[:, : int(length)]


@filter_jit
def _run(
    model: CausalLM,
    ids: Array,
    mask: Array,
    keys: PRNGKeyArray | None,
    s: GenerationSettings,
    put: Any,
) -> tuple[Array, Array, Array]:
    """Prefill, then the decoding loop; returns the token buffer, the new tokens' scores and
    the steps taken."""
    model = nn.inference_mode(model)  # at trace time: decoding drops nothing
    batch, prompt_len = ids.shape
    max_len = prompt_len + s.max_new_tokens
    positions = jnp.where(mask, jnp.cumsum(mask, axis=1) - 1, 1).astype(jnp.int32)
    layout = model.lm_parts().decoder.cache_layout()
    parts = model.lm_parts()
    vocab = (parts.token_embedding if parts.lm_head is None else parts.lm_head).weight.shape[0]
    state = start_decoding(ids, mask, keys, s, vocab)
    cache = KVCache.empty(layout, batch, max_len).at(jnp.int32(0), state.valid)
    logits, cache = cached_logits(model, ids, positions, cache)
    state, token = choose_next(jnp.int32(0), state, logits, s, put)
    # The new token's position: the number of real tokens before it.
    position = jnp.sum(mask, axis=1, dtype=jnp.int32)

    def cond(loop: tuple[Any, ...]) -> Array:
        return running(loop[0], loop[1], s)

    def body(loop: tuple[Any, ...]) -> tuple[Any, ...]:
        step, state, cache, token, position = loop
        offset = prompt_len + step - 1
        new, pos = token[:, None], position[:, None]
        logits, cache = cached_logits(model, new, pos, cache.at(offset, state.valid))
        state, token = choose_next(step, state, logits, s, put)
        return step + 1, state, cache, token, position + 1

    step, state, *_ = lax.while_loop(cond, body, (jnp.int32(1), state, cache, token, position))
    return state.tokens, state.scores, step
