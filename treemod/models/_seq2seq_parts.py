"""`Seq2SeqLM`, the base of the encoder-decoder models, and `CrossKV`, their encoder keys.

`generate_seq2seq` reads a model through this contract only: `encode(inputs)` runs the encoder
once (its hidden states and the mask over them), `cross_kv(encoded)` projects every decoder
layer's cross-attention keys and values from them once, and `decode(ids, positions, cache,
cross)` runs the decoder over new tokens with the self-attention `KVCache` of `_causal_lm.py`
and the precomputed `CrossKV`; `logits(hidden)` is the head. T5 and Whisper implement it with
their own layers; the cache and the cross keys are arguments of their attentions (`None` in a
plain forward pass), so LoRA adapters apply unchanged.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar, NamedTuple

from jax import Array

from treemod.models._base import PretrainedModel
from treemod.models._causal_lm import CacheLayout, KVCache

__all__ = ["CrossKV", "Encoded", "Seq2SeqLM"]


class Encoded(NamedTuple):
    """The encoder's output as the decoder reads it.

    Arguments:
        hidden: `(batch, src_len, hidden)` last hidden states.
        mask: `None`, or `(batch, src_len)` booleans, True on real (not padded) positions.
    """

    hidden: Array
    mask: Array | None


class CrossKV(NamedTuple):
    """Every decoder layer's cross-attention keys and values, computed once per generation.

    Arguments:
        keys: per decoder layer, `(batch, src_len, heads, head_dim)`.
        values: the same.
        mask: `None` or `(batch, 1, 1, src_len)` booleans over the encoder positions.
    """

    keys: tuple[Array, ...]
    values: tuple[Array, ...]
    mask: Array | None


class Seq2SeqLM(PretrainedModel):
    """The base of the encoder-decoder language models: the contract `generate_seq2seq` reads.

    A subclass names its encoder's inputs (`encoder_inputs`: `("input_ids", "attention_mask")`
    or `("input_features",)`), checks and converts them (`encoder_arrays`), and implements
    `encode`, `cross_kv`, `cache_layout`, `decode` and `logits`. `prepend_start` says whether
    `generate_seq2seq` puts `decoder_start_token_id` before a given decoder prompt that does not
    start with it (as `transformers` does for every family but Whisper).
    """

    encoder_inputs: ClassVar[tuple[str, ...]]
    prepend_start: ClassVar[bool] = True

    @abc.abstractmethod
    def encoder_arrays(self, owner: str, inputs: dict[str, Any]) -> dict[str, Array]:
        """The encoder's inputs checked and made JAX arrays (`None`s left out)."""

    @abc.abstractmethod
    def encode(self, inputs: dict[str, Array]) -> Encoded:
        """Run the encoder once over `encoder_arrays`' output."""

    @abc.abstractmethod
    def cross_kv(self, encoded: Encoded) -> CrossKV:
        """Every decoder layer's cross-attention keys and values over `encoded`."""

    @abc.abstractmethod
    def cache_layout(self) -> CacheLayout:
        """The decoder's self-attention cache: layers, heads, head size, dtype."""

    @abc.abstractmethod
    def decode(
        self, ids: Array, positions: Array, cache: KVCache, cross: CrossKV
    ) -> tuple[Array, KVCache]:
        """The decoder's last hidden states over new tokens, reading and filling `cache`.

        Arguments:
            ids: `(batch, q_len)` new decoder token ids, for slots `cache.offset ..`.
            positions: `(batch, q_len)` their positions.
            cache: the self-attention cache, at layer 0.
            cross: the cross-attention keys and values (`cross_kv`).

        Returns:
            `(hidden, cache)`: `(batch, q_len, hidden)` (before the head) and the cache.
        """

    @abc.abstractmethod
    def logits(self, hidden: Array) -> Array:
        """The language-modelling head: `(..., hidden)` to `(..., vocab_size)`."""

    @abc.abstractmethod
    def decoder_start_token_id(self) -> int | None:
        """The token the decoder starts from (the config's), `None` when it names none."""

    def max_positions(self) -> tuple[str, int] | None:
        """`(config key, limit)` when no decoder position reaches `limit`; `None` else."""
        return None
