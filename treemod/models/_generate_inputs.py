"""The inputs of a generation, checked: prompts, sampling keys, length buckets, the streamer.

Shared by `generate` and the encoder-decoder generation; every error names the argument.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from treemod.models._generation_config import GenerationSettings

__all__ = ["bucket_padding", "prompt_arrays", "sampling_keys", "stream_put"]


def prompt_arrays(owner: str, input_ids: Any, attention_mask: Any, vocab: int) -> tuple[Any, Any]:
    """Check prompts for generation and return them as NumPy `(int32 ids, bool mask)`.

    Every id must be a token of the vocabulary (`[0, vocab)`), as `transformers`' embedding
    requires; the mask must be left padding only, with at least one token per row.

    Arguments:
        owner: who generates, for messages.
        input_ids: `(batch, prompt_len)` integer ids.
        attention_mask: `None` or `(batch, prompt_len)`, nonzero for tokens.
        vocab: the vocabulary size.

    Returns:
        `(ids, mask)`.
    """
    ids = np.asarray(input_ids)
    if ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(
            f"{owner}: `input_ids` must be integer token ids of shape (batch, prompt_len); got "
            f"{ids.dtype}{list(ids.shape)}. Add a batch axis with input_ids[None] for one prompt."
        )
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(
            f"{owner}: `input_ids` has shape {list(ids.shape)}: generation needs at least one "
            "prompt of at least one token (start a prompt with the tokenizer's BOS token)."
        )
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        row, col = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{owner}: `input_ids`[{row}, {col}] is {int(ids[row, col])}, not a token id of the "
            f"model's vocabulary [0, {vocab}) (a tokenizer of another model, or ids of another "
            "dtype?)."
        )
    if attention_mask is None:
        mask = np.ones(ids.shape, bool)
    else:
        mask = np.asarray(attention_mask)
        if mask.shape != ids.shape:
            raise ValueError(
                f"{owner}: `attention_mask` must have the shape of `input_ids` "
                f"{list(ids.shape)} (1 for tokens, 0 for left padding); got {list(mask.shape)}."
            )
        mask = mask.astype(bool)
    width = ids.shape[1]
    for row in range(ids.shape[0]):
        real = np.flatnonzero(mask[row])
        if real.size == 0:
            raise ValueError(f"{owner}: `attention_mask` row {row} has no token (all padding).")
        if real[-1] - real[0] + 1 != real.size or real[-1] != width - 1:
            raise ValueError(
                f"{owner}: `attention_mask` row {row} has padding after or between its tokens "
                "(right padding): a causal LM continues from the last position, so pad on the "
                "left (tokenizer.padding_side = 'left')."
            )
    return ids.astype(np.int32), mask


def sampling_keys(owner: str, key: Any, s: GenerationSettings, rows: int) -> Any:
    """The sampling key(s) as typed keys (one, or one per row), None for greedy decoding."""
    if not s.do_sample:
        return None
    if key is None:
        raise ValueError(
            f"{owner}: sampling (do_sample=True, from the call or the model's generation "
            "config) needs `key=` (a PRNG key, or one per row); pass do_sample=False to "
            "decode greedily."
        )
    key = jnp.asarray(key)
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    batch_shape = key.shape if typed else key.shape[:-1]
    if batch_shape not in ((), (rows,)):
        raise ValueError(
            f"{owner}: `key` must be one PRNG key or {rows} keys (one per row: batch x "
            f"num_return_sequences); got keys of shape {list(batch_shape)}."
        )
    return key if typed else jax.random.wrap_key_data(key)


def bucket_padding(owner: str, width: int, multiple: Any) -> int:
    """How many columns of left padding bring `width` to a multiple of `multiple`."""
    if multiple is None:
        return 0
    if not isinstance(multiple, int | np.integer) or isinstance(multiple, bool) or multiple < 1:
        raise ValueError(f"{owner}: `pad_to_multiple_of` must be an int >= 1; got {multiple!r}.")
    return int(-width % multiple)


def stream_put(owner: str, streamer: Any) -> Any:
    """The streamer's `put`, None without a streamer."""
    if streamer is None:
        return None
    if not (callable(getattr(streamer, "put", None)) and callable(getattr(streamer, "end", None))):
        raise TypeError(
            f"{owner}: `streamer` must have put(ids) and end() methods (as transformers' "
            f"TextStreamer); got {type(streamer).__name__}."
        )
    return streamer.put
