"""What a generation does: `generate`'s arguments over the checkpoint's generation config.

As in `transformers`, each value comes from the call if given, else from the model's
generation config (the checkpoint's `generation_config.json`, or without one the token ids of
its `config.json`), else from `transformers`' defaults (`top_k` 50, `max_length` 20, ...).
Values `transformers`' generation reads that treemod does not implement (beam search, n-gram
blocking, ...) are refused by name wherever they come from, rather than decoded otherwise.
Every error names the argument, or the file and key the value came from.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from treemod.models._base import PretrainedConfig

__all__ = ["CALL_KEYS", "GenerationSettings", "generation_settings", "model_generation_config"]

# transformers' global defaults for the values treemod implements (None: not set).
_DEFAULTS: dict[str, Any] = {
    "max_new_tokens": None,
    "max_length": 20,
    "min_new_tokens": None,
    "min_length": 0,
    "do_sample": False,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "repetition_penalty": 1.0,
    "num_return_sequences": 1,
    "eos_token_id": None,
    "pad_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}
CALL_KEYS = tuple(_DEFAULTS)
"""The generation values `generate` takes as arguments."""

# Values transformers' generation reads that treemod does not implement, with the values that
# leave them off: anything else is refused.
_UNIMPLEMENTED: dict[str, tuple[Any, ...]] = {
    "num_beams": (1, None),
    "num_beam_groups": (1, None),
    "diversity_penalty": (0.0, None),
    "penalty_alpha": (None,),
    "no_repeat_ngram_size": (0, None),
    "encoder_no_repeat_ngram_size": (0, None),
    "encoder_repetition_penalty": (1.0, None),
    "bad_words_ids": (None,),
    "force_words_ids": (None,),
    "sequence_bias": (None,),
    "forced_bos_token_id": (None,),
    "forced_eos_token_id": (None,),
    "forced_decoder_ids": (None,),
    "typical_p": (1.0, None),
    "epsilon_cutoff": (0.0, None),
    "eta_cutoff": (0.0, None),
    "top_h": (None,),
    "exponential_decay_length_penalty": (None,),
    "guidance_scale": (None, 1.0),
    "renormalize_logits": (False, None),
    "constraints": (None,),
    "stop_strings": (None,),
    "max_time": (None,),
    "prompt_lookup_num_tokens": (None,),
    "dola_layers": (None,),
}
# The token ids transformers' `GenerationConfig.from_model_config` takes from `config.json`.
_FROM_MODEL_CONFIG = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id")
_INT32 = 2**31


@dataclasses.dataclass(frozen=True)
class GenerationSettings:
    """The resolved values of one generation (static: part of the compiled program's key)."""

    max_new_tokens: int
    min_new_tokens: int
    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float
    num_return_sequences: int
    eos: tuple[int, ...]  # every end-of-sequence id
    pad: int
    suppress: tuple[int, ...]
    begin_suppress: tuple[int, ...]


def model_generation_config(config: PretrainedConfig) -> dict[str, Any]:
    """The model's generation defaults, as `transformers` builds its `generation_config`: the
    checkpoint's `generation_config.json` when it had one, else the token ids in `config.json`.

    Arguments:
        config: the model's config.

    Returns:
        A JSON-ready dict.

    Example:
        >>> from treemod.models import PretrainedConfig
        >>> from treemod.models._generation_config import model_generation_config
        >>> model_generation_config(PretrainedConfig({"eos_token_id": 2, "hidden_size": 8}))
        {'eos_token_id': 2}
        >>> gen = {"eos_token_id": [2, 7], "do_sample": True}
        >>> model_generation_config(PretrainedConfig({"eos_token_id": 2}, generation=gen))
        {'eos_token_id': [2, 7], 'do_sample': True}
    """
    if config.generation is not None:
        return config.generation.to_dict()
    values = config.to_dict()
    return {k: values[k] for k in _FROM_MODEL_CONFIG if values.get(k) is not None}


class _Reader:
    """Reads each value from the call, the model's generation config or the defaults, and
    names its source in errors."""

    def __init__(
        self, owner: str, call: Mapping[str, Any], model: Mapping[str, Any], file: str
    ) -> None:
        self.owner, self.call, self.model, self.file = owner, call, model, file

    def source(self, key: str) -> str:
        if self.call.get(key) is not None:
            return f"`{key}`"
        if self.model.get(key) is not None:
            return f"{self.file} key {key!r}"
        return f"the default {key}"

    def get(self, key: str) -> Any:
        for values in (self.call, self.model):
            if values.get(key) is not None:
                return values[key]
        return _DEFAULTS[key]

    def error(self, key: str, want: str) -> ValueError:
        return ValueError(f"{self.owner}: {self.source(key)} is {self.get(key)!r}; {want}.")

    def integer(self, key: str, low: int, high: int = _INT32) -> int | None:
        value = self.get(key)
        if value is None:
            return None
        if not _is_int(value) or not low <= value < high:
            raise self.error(key, f"it must be an int in [{low}, {high})")
        return int(value)

    def number(self, key: str, low: float, high: float, *, open_low: bool) -> float | None:
        value = self.get(key)
        if value is None:
            return None
        ok = isinstance(value, int | float | np.number) and not isinstance(value, bool)
        if ok:
            value = float(value)
            ok = math.isfinite(value) and (value > low if open_low else value >= low)
            ok = ok and value <= high
        if not ok:
            if math.isinf(high):
                want = f"a finite number {'>' if open_low else '>='} {low:g}"
            else:
                want = f"a number in {'(' if open_low else '['}{low:g}, {high:g}]"
            raise self.error(key, f"it must be {want}")
        return float(value)

    def ids(self, key: str, vocab: int | None = None) -> tuple[int, ...]:
        value = self.get(key)
        if value is None:
            return ()
        items = value if isinstance(value, list | tuple) else [value]
        high = _INT32 if vocab is None else vocab
        if not all(_is_int(i) and 0 <= i < high for i in items):
            raise self.error(key, f"it must be a token id or a list of token ids in [0, {high})")
        return tuple(int(i) for i in items)


def _same(value: Any, neutral: Any) -> bool:
    """`value` is `neutral` (1 and 1.0 alike, True not 1)."""
    if value is None or neutral is None or isinstance(neutral, bool):
        return value is neutral
    return not isinstance(value, bool) and value == neutral


def _is_int(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def generation_settings(
    owner: str,
    config: PretrainedConfig,
    call: Mapping[str, Any],
    *,
    generation_config: Mapping[str, Any] | None,
    prompt_len: int,
    vocab_size: int,
) -> GenerationSettings:
    """Resolve and check one generation's values.

    Arguments:
        owner: who generates, for messages (`"generate (GPT2LMHeadModel)"`).
        config: the model's config (its `generation` is the checkpoint's generation config).
        call: the values given to `generate` (None: not given).
        generation_config: replaces the model's generation config when given (`{}`:
            `transformers`' defaults only).
        prompt_len: the prompts' length (for `max_length` and `min_length`).
        vocab_size: the token embedding's rows (padding is fed back to the model).

    Returns:
        The settings.
    """
    model = model_generation_config(config) if generation_config is None else generation_config
    if not isinstance(model, Mapping):
        raise TypeError(
            f"{owner}: `generation_config` must be a mapping of generation values; got "
            f"{type(model).__name__}."
        )
    file = "generation_config.json" if config.generation is not None else "config.json"
    if generation_config is not None:
        file = "`generation_config`"
    r = _Reader(owner, call, model, file)
    for key, neutral in _UNIMPLEMENTED.items():
        value = model.get(key)
        if not any(_same(value, n) for n in neutral):
            raise ValueError(
                f"{owner}: {file} key {key!r} is {value!r}, which treemod's generate does not "
                f"implement (it would decode otherwise than transformers). Pass "
                f"generation_config= a dict without it (or {{}} for transformers' defaults) to "
                f"decode without it."
            )
    do_sample = r.get("do_sample")
    if not isinstance(do_sample, bool):
        raise r.error("do_sample", "it must be True or False")
    max_new = r.integer("max_new_tokens", 1)
    if max_new is None:
        max_length = r.integer("max_length", 1)
        assert max_length is not None
        max_new = max_length - prompt_len
        if max_new < 1:
            raise ValueError(
                f"{owner}: the prompts are {prompt_len} tokens long, and {r.source('max_length')}"
                f" = {max_length} leaves no new token; pass max_new_tokens=."
            )
    min_new = r.integer("min_new_tokens", 0) or 0
    min_new = max(min_new, (r.integer("min_length", 0) or 0) - prompt_len)
    temperature = 1.0
    if do_sample:  # as transformers: greedy decoding reads no temperature (0 included)
        temperature = r.number("temperature", 0.0, math.inf, open_low=True) or 1.0
    top_k = r.integer("top_k", 0) if do_sample else None
    top_p = r.number("top_p", 0.0, 1.0, open_low=True) if do_sample else None
    min_p = r.number("min_p", 0.0, 1.0, open_low=False) if do_sample else None
    penalty = r.number("repetition_penalty", 0.0, math.inf, open_low=True)
    returns = r.integer("num_return_sequences", 1)
    assert returns is not None and penalty is not None
    if returns > 1 and not do_sample:
        raise ValueError(
            f"{owner}: {r.source('num_return_sequences')} is {returns}, but greedy decoding "
            f"gives one sequence per prompt (as transformers); pass do_sample=True and a key."
        )
    eos = r.ids("eos_token_id")
    pad_ids = r.ids("pad_token_id", vocab_size)
    if len(pad_ids) > 1:
        raise r.error("pad_token_id", "it must be one token id")
    # Without a pad id, finished rows repeat the first end-of-sequence id, as transformers;
    # an id past the vocabulary is never generated, so no row finishes with it.
    in_vocab = [e for e in eos if e < vocab_size]
    pad = pad_ids[0] if pad_ids else (in_vocab[0] if in_vocab else 0)
    return GenerationSettings(
        max_new_tokens=max_new,
        min_new_tokens=min_new,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k or None,
        top_p=None if top_p is None or top_p >= 1.0 else top_p,
        min_p=min_p,
        repetition_penalty=penalty,
        num_return_sequences=returns,
        eos=eos,
        pad=pad,
        suppress=tuple(i for i in r.ids("suppress_tokens") if i < vocab_size),
        begin_suppress=tuple(i for i in r.ids("begin_suppress_tokens") if i < vocab_size),
    )
