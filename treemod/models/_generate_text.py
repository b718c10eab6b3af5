"""`generate_text`: text (or a chat) in, text out, with a causal LM and its tokenizer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from treemod.models._causal_lm import CausalLM
from treemod.models._generate import generate
from treemod.models._generation_config import model_generation_config
from treemod.models._tokenizer import Tokenizer

__all__ = ["generate_text"]

Chat = Sequence[Mapping[str, Any]]


def _is_chat(value: Any) -> bool:
    return (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and all(isinstance(m, Mapping) for m in value)
        and len(value) > 0
    )


def generate_text(
    model: CausalLM,
    tokenizer: Tokenizer,
    prompts: str | Chat | Sequence[str] | Sequence[Chat],
    *,
    stop_strings: str | Sequence[str] | None = None,
    **kwargs: Any,
) -> str | list[str]:
    """Continue text prompts, or answer conversations, and return the new text.

    Strings are encoded with the tokenizer's special tokens (a BOS where it adds one); a
    conversation (`[{"role": "user", "content": ...}, ...]`) goes through the checkpoint's chat
    template with the assistant's turn opened, as `transformers`' `apply_chat_template(...,
    add_generation_prompt=True)`. The batch is left-padded and decoded with `generate` (every
    keyword argument is `generate`'s); generation stops at the model's end-of-sequence ids, or
    the tokenizer's when the model names none. The new tokens are decoded without special
    tokens. With `stop_strings`, each text ends with the token that completes the first stop
    string, as `transformers`' `stop_strings` leaves it.

    Arguments:
        model: the causal language model.
        tokenizer: its tokenizer (`Tokenizer.from_pretrained` of the same directory).
        prompts: a text, a conversation, or a list of either.
        stop_strings: a string or several that end a text.
        kwargs: `generate`'s arguments (`max_new_tokens`, `do_sample`, `key`, ...).

    Returns:
        The new text: one string for one prompt, a list for a list.
    """
    single = isinstance(prompts, str) or _is_chat(prompts)
    batch: list[Any] = [prompts] if single else list(prompts)
    chats = [_is_chat(p) for p in batch]
    if any(chats) and not all(chats):
        raise TypeError("generate_text: give texts or conversations, not both in one batch.")
    if all(chats):
        texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in batch]
        inputs = tokenizer(texts, add_special_tokens=False)
    else:
        if not all(isinstance(p, str) for p in batch):
            raise TypeError(
                "generate_text: `prompts` must be a text, a conversation (a list of message "
                "dicts), or a list of either."
            )
        inputs = tokenizer(batch)
    defaults = model_generation_config(model.config)
    if kwargs.get("eos_token_id") is None and defaults.get("eos_token_id") is None:
        kwargs["eos_token_id"] = tokenizer.eos_token_id
    if kwargs.get("pad_token_id") is None and defaults.get("pad_token_id") is None:
        kwargs["pad_token_id"] = tokenizer.pad_token_id
    out = generate(model, inputs["input_ids"], attention_mask=inputs["attention_mask"], **kwargs)
    new = np.asarray(out)[:, inputs["input_ids"].shape[1] :]
    stops = [stop_strings] if isinstance(stop_strings, str) else list(stop_strings or ())
    texts = []
    for row in new:
        texts.append(tokenizer.decode(_until_stop(tokenizer, row, stops), skip_special_tokens=True))
    return texts[0] if single else texts


def _until_stop(tokenizer: Tokenizer, row: np.ndarray, stops: list[str]) -> np.ndarray:
    """The row up to the token whose text completes the first stop string (all of it if none)."""
    if not stops:
        return row
    for end in range(1, len(row) + 1):
        if any(s in tokenizer.decode(row[:end]) for s in stops):
            return row[:end]
    return row
