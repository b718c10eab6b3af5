"""Whisper: `WhisperModel` and `WhisperForConditionalGeneration` from Hugging Face config dicts.

The encoder reads log-mel features `(batch, num_mel_bins, 2 * max_source_positions)` (3000
frames for the released models), the decoder token ids; `proj_out` is the decoder's token
embedding unless `tie_word_embeddings` is false. `generate_seq2seq` decodes greedily or by
sampling from a given decoder prompt (the language, task and timestamp tokens that
`transformers`' Whisper `generate` would force are the caller's `decoder_input_ids`); its
Whisper-specific options (long-form audio, timestamps, temperature fallback, token
suppression) are not implemented. Models are built in inference mode (dropout off).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import (
    causal_mask,
    projection_keys,
    split_key,
    token_inputs,
    unwrapped,
)
from treemod.models._axis_layouts import vocab_head
from treemod.models._base import (
    PretrainedConfig,
    PretrainedModel,
    config_error,
    register_architecture,
)
from treemod.models._causal_lm import CacheLayout, KVCache
from treemod.models._config_values import Value, read_config
from treemod.models._hf_activations import hf_activation
from treemod.models._seq2seq_parts import CrossKV, Encoded, Seq2SeqLM
from treemod.models._whisper_layers import (
    WhisperDecoder,
    WhisperEncoder,
    build_decoder,
    build_encoder,
)

__all__ = [
    "WHISPER_VALUES",
    "WhisperForConditionalGeneration",
    "WhisperModel",
    "features",
    "whisper_values",
]

WHISPER_VALUES: dict[str, Value] = {
    "vocab_size": Value(51865, "size"),
    "num_mel_bins": Value(80, "size"),
    "encoder_layers": Value(4, "size"),
    "encoder_attention_heads": Value(6, "size"),
    "decoder_layers": Value(4, "size"),
    "decoder_attention_heads": Value(6, "size"),
    "decoder_ffn_dim": Value(1536, "size"),
    "encoder_ffn_dim": Value(1536, "size"),
    "encoder_layerdrop": Value(0.0, "prob"),
    "decoder_layerdrop": Value(0.0, "prob"),
    "decoder_start_token_id": Value(50257, "count", nullable=True),
    "use_cache": Value(True, "bool"),
    "is_encoder_decoder": Value(True, "bool"),
    "activation_function": Value("gelu"),
    "d_model": Value(384, "size"),
    "dropout": Value(0.0, "dropout"),
    "attention_dropout": Value(0.0, "dropout"),
    "activation_dropout": Value(0.0, "dropout"),
    "init_std": Value(0.02, "positive"),
    # transformers' Whisper forward never applies embed_scale: read, without effect.
    "scale_embedding": Value(False, "bool"),
    "max_source_positions": Value(1500, "size"),
    "max_target_positions": Value(448, "size"),
    "pad_token_id": Value(50256, "count", nullable=True),
    "bos_token_id": Value(50256, "count", nullable=True),
    "eos_token_id": Value(50256),
    # Generation and audio-classification settings: generate_seq2seq does not apply them.
    "suppress_tokens": Value(None),
    "begin_suppress_tokens": Value([220, 50256]),
    "use_weighted_layer_sum": Value(False, "bool"),
    "classifier_proj_size": Value(256, "size"),
    "median_filter_width": Value(7, "size"),
    # SpecAugment masks features in training mode only; training with it on is refused.
    "apply_spec_augment": Value(False, "bool"),
    "mask_time_prob": Value(0.05, "prob"),
    "mask_time_length": Value(10, "size"),
    "mask_time_min_masks": Value(2, "count"),
    "mask_feature_prob": Value(0.0, "prob"),
    "mask_feature_length": Value(10, "size"),
    "mask_feature_min_masks": Value(0, "count"),
    "tie_word_embeddings": Value(True, "bool"),
}
"""The values `WhisperConfig` reads, with its defaults."""

_ALIASES = {
    "num_attention_heads": "encoder_attention_heads",
    "num_key_value_heads": "encoder_attention_heads",
    "hidden_size": "d_model",
    "num_hidden_layers": "encoder_layers",
}


def whisper_values(owner: str, config: Mapping[str, Any], decoder: bool = True) -> dict[str, Any]:
    """The config read as `WhisperConfig` reads it, checked (the decoder's heads only for a
    model with a decoder)."""
    v = read_config(owner, config, WHISPER_VALUES, _ALIASES)
    d = v["d_model"]
    heads = ("encoder_attention_heads", "decoder_attention_heads")
    for name in heads if decoder else heads[:1]:
        if d % v[name]:
            raise config_error(owner, name, v[name], f"a divisor of d_model={d}")
    if d % 2 or d < 4:
        raise config_error(owner, "d_model", d, "an even number >= 4 (sinusoidal positions)")
    hf_activation(owner, "activation_function", v["activation_function"])
    return v


def features(owner: str, encoder: WhisperEncoder, input_features: Any) -> Array:
    """`input_features` checked against the encoder's mel bins and frames, in its dtype."""
    x = jnp.asarray(input_features)
    frames = 2 * encoder.embed_positions.weight.shape[0]
    mels = unwrapped(encoder.conv1).weight.shape[1]
    if x.ndim != 3 or x.shape[1:] != (mels, frames):
        raise ValueError(
            f"{owner}: `input_features` must be log-mel features of shape "
            f"(batch, num_mel_bins={mels}, {frames}) (2 * max_source_positions frames; "
            f"pad shorter audio as WhisperFeatureExtractor does); got "
            f"{x.dtype}{list(x.shape)}."
        )
    return x.astype(unwrapped(encoder.conv1).weight.dtype)


class _WhisperBase(PretrainedModel):
    model_type: ClassVar[str] = "whisper"
    base_model_prefix: ClassVar[str] = "model"

    def _parts(self) -> tuple[WhisperEncoder, WhisperDecoder]:
        raise NotImplementedError

    def _encode(self, input_features: Any, key: PRNGKeyArray | None) -> Array:
        encoder, _ = self._parts()
        return encoder(features(type(self).__name__, encoder, input_features), key=key)

    def _decode(
        self,
        states: Array,
        decoder_input_ids: Any,
        decoder_attention_mask: Any,
        decoder_position_ids: Any,
        key: PRNGKeyArray | None,
    ) -> Array:
        owner = type(self).__name__
        _, decoder = self._parts()
        if decoder_input_ids is None:
            raise ValueError(f"{owner}: pass `decoder_input_ids=` (or `labels=`).")
        ids, mask, positions = token_inputs(
            owner, decoder_input_ids, decoder_attention_mask, decoder_position_ids
        )
        seq = ids.shape[1]
        limit = decoder.embed_positions.weight.shape[0]
        if positions is None and seq > limit:
            raise ValueError(f"{owner}: {seq} decoder tokens exceed max_target_positions={limit}.")
        pos = jnp.broadcast_to(jnp.arange(seq), ids.shape) if positions is None else positions
        hidden, _ = decoder(ids, pos, causal_mask(seq, mask), states=states, key=key)
        return hidden

    @classmethod
    def _build_parts(
        cls, config: Mapping[str, Any] | PretrainedConfig, key: PRNGKeyArray, dtype: Any
    ) -> tuple[PretrainedConfig, dict[str, Any], WhisperEncoder, WhisperDecoder]:
        config = PretrainedConfig(config)
        v = whisper_values(cls.__name__, config)
        dtype = jnp.float32 if dtype is None else dtype
        k_enc, k_dec = jax.random.split(key)
        return config, v, build_encoder(v, dtype, key=k_enc), build_decoder(v, dtype, key=k_dec)


@register_architecture
class WhisperModel(_WhisperBase):
    """The Whisper encoder-decoder without a head: returns the decoder's `last_hidden_state`.

    Called with `input_features` `(batch, num_mel_bins, 2 * max_source_positions)`,
    `decoder_input_ids` `(batch, tgt)`, optionally `decoder_attention_mask`,
    `decoder_position_ids`, and `key` for dropout in training mode.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.whisper import WhisperModel
        >>> config = {"vocab_size": 50, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
        ...           "encoder_attention_heads": 2, "decoder_attention_heads": 2,
        ...           "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "num_mel_bins": 8,
        ...           "max_source_positions": 10, "max_target_positions": 12}
        >>> model = WhisperModel.from_config(config, key=jax.random.key(0))
        >>> model(input_features=jnp.zeros((1, 8, 20)), decoder_input_ids=jnp.array([[1, 2]])).shape
        (1, 2, 16)
    """

    architecture: ClassVar[str] = "WhisperModel"

    encoder: WhisperEncoder
    decoder: WhisperDecoder

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights (`transformers`' initialisation) from a config dict.

        Arguments:
            config: the `config.json` dict; absent keys take `WhisperConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (float32 by default).

        Returns:
            The model, in inference mode.
        """
        config, _, encoder, decoder = cls._build_parts(config, key, dtype)
        return cls(config=config, encoder=encoder, decoder=decoder)

    def _parts(self) -> tuple[WhisperEncoder, WhisperDecoder]:
        return self.encoder, self.decoder

    def __call__(
        self,
        *,
        input_features: Any,
        decoder_input_ids: Any,
        decoder_attention_mask: Any = None,
        decoder_position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The decoder's last hidden state `(batch, tgt, d_model)`.

        Arguments:
            input_features: `(batch, num_mel_bins, frames)` log-mel features.
            decoder_input_ids: `(batch, tgt)` decoder token ids.
            decoder_attention_mask: `(batch, tgt)`, 1 for tokens and 0 for padding.
            decoder_position_ids: `(batch, tgt)` positions (default `0 .. tgt - 1`).
            key: PRNG key for dropout (training mode only).

        Returns:
            `last_hidden_state`.
        """
        k_enc, k_dec = split_key(key, 2)
        states = self._encode(input_features, k_enc)
        return self._decode(
            states, decoder_input_ids, decoder_attention_mask, decoder_position_ids, k_dec
        )


@register_architecture
@axis_names(vocab_head("proj_out"))
class WhisperForConditionalGeneration(_WhisperBase, Seq2SeqLM):
    """Whisper with its head `proj_out`: returns `logits`; generates with `generate_seq2seq`.

    `proj_out` is `None` when tied to `model.decoder.embed_tokens` (the default), else a
    bias-free `nn.Linear`. Inputs as `WhisperModel`'s, or `labels` instead of
    `decoder_input_ids` (shifted right after `decoder_start_token_id`, -100 made
    `pad_token_id`, as `transformers` does; the loss is left to the caller).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.whisper import WhisperForConditionalGeneration
        >>> config = {"vocab_size": 50, "d_model": 16, "encoder_layers": 1, "decoder_layers": 1,
        ...           "encoder_attention_heads": 2, "decoder_attention_heads": 2,
        ...           "encoder_ffn_dim": 32, "decoder_ffn_dim": 32, "num_mel_bins": 8,
        ...           "max_source_positions": 10, "max_target_positions": 12,
        ...           "decoder_start_token_id": 1, "pad_token_id": 0}
        >>> model = WhisperForConditionalGeneration.from_config(config, key=jax.random.key(0))
        >>> model(input_features=jnp.zeros((1, 8, 20)), labels=jnp.array([[3, 4]])).shape
        (1, 2, 50)
        >>> model.tied_weights()
        {'proj_out.weight': 'model.decoder.embed_tokens.weight'}
    """

    architecture: ClassVar[str] = "WhisperForConditionalGeneration"
    encoder_inputs: ClassVar[tuple[str, ...]] = ("input_features",)
    prepend_start: ClassVar[bool] = False

    model: WhisperModel
    proj_out: nn.Linear | None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights from a config dict (see `WhisperModel.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model, in inference mode.
        """
        k_body, k_head = jax.random.split(key)
        config, v, encoder, decoder = cls._build_parts(config, k_body, dtype)
        body = WhisperModel(config=config, encoder=encoder, decoder=decoder)
        head = None
        if not v["tie_word_embeddings"]:
            init = nn.init.normal(v["init_std"])
            head = nn.Linear(
                v["d_model"], v["vocab_size"], False, dtype or jnp.float32, weight_init=init,
                key=k_head,
            )  # fmt: skip
        return cls(config=config, model=body, proj_out=head)

    def _parts(self) -> tuple[WhisperEncoder, WhisperDecoder]:
        return self.model.encoder, self.model.decoder

    @classmethod
    def peft_task_type(cls) -> str | None:
        """None: PEFT's `SEQ_2_SEQ_LM` wrapper passes `input_ids`, which Whisper does not take
        (PEFT's Whisper recipes set no task type)."""
        return None

    def tied_weights(self) -> dict[str, str]:
        """`{"proj_out.weight": "model.decoder.embed_tokens.weight"}` when tied, else `{}`."""
        if self.proj_out is None:
            return {"proj_out.weight": "model.decoder.embed_tokens.weight"}
        return {}

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The head over decoder states `(..., d_model)` (`key`: `proj_out`'s, for LoRA
        dropout)."""
        if self.proj_out is not None:
            return self.proj_out(hidden, key=key)
        return jnp.einsum("...d,vd->...v", hidden, self.model.decoder.embed_tokens.weight)

    def __call__(
        self,
        *,
        input_features: Any,
        decoder_input_ids: Any = None,
        decoder_attention_mask: Any = None,
        decoder_position_ids: Any = None,
        labels: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The logits `(batch, tgt, vocab_size)`.

        Arguments:
            input_features: `(batch, num_mel_bins, frames)` log-mel features.
            decoder_input_ids: `(batch, tgt)` decoder token ids.
            decoder_attention_mask: `(batch, tgt)`, 1 for tokens and 0 for padding.
            decoder_position_ids: `(batch, tgt)` positions (default `0 .. tgt - 1`).
            labels: `(batch, tgt)` targets, shifted right into `decoder_input_ids` when those
                are not given.
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        owner = type(self).__name__
        if labels is not None:
            ids, _, _ = token_inputs(owner, labels, None, None)
            limit = self.model.decoder.embed_positions.weight.shape[0]
            if ids.shape[1] > limit:
                raise ValueError(
                    f"{owner}: labels of length {ids.shape[1]} exceed max_target_positions={limit}."
                )
            if decoder_input_ids is None:
                decoder_input_ids = self._shift_right(owner, ids)
        k_enc, k_dec = split_key(key, 2)
        states = self._encode(input_features, k_enc)
        hidden = self._decode(
            states, decoder_input_ids, decoder_attention_mask, decoder_position_ids, k_dec
        )
        return self.logits(hidden, key=projection_keys(key, 1)[0])

    def _shift_right(self, owner: str, labels: Array) -> Array:
        v = whisper_values(owner, self.config)
        start, pad = v["decoder_start_token_id"], v["pad_token_id"]
        if start is None or pad is None:
            name = "decoder_start_token_id" if start is None else "pad_token_id"
            raise ValueError(
                f"{owner}: `labels` are shifted right after the config's "
                f"decoder_start_token_id with -100 made pad_token_id; the config has no {name}. "
                "Pass decoder_input_ids."
            )
        shifted = jnp.concatenate([jnp.full_like(labels[:, :1], start), labels[:, :-1]], axis=1)
        return jnp.where(shifted == -100, pad, shifted)

    # The contract generate_seq2seq reads (Seq2SeqLM).

    def encoder_arrays(self, owner: str, inputs: dict[str, Any]) -> dict[str, Array]:
        """`input_features` as an array (checked when encoding)."""
        if inputs.get("input_features") is None:
            raise ValueError(f"{owner}: pass `input_features=` (log-mel features).")
        return {"input_features": jnp.asarray(inputs["input_features"])}

    def encode(self, inputs: dict[str, Array]) -> Encoded:
        """The encoder's last hidden states (every frame is attended: no mask)."""
        return Encoded(self._encode(inputs["input_features"], None), None)

    def cross_kv(self, encoded: Encoded) -> CrossKV:
        """Each decoder layer's `encoder_attn` keys and values over the encoder's states."""
        pairs = [
            layer.encoder_attn.keys_values(encoded.hidden) for layer in self.model.decoder.layers
        ]
        return CrossKV(tuple(k for k, _ in pairs), tuple(v for _, v in pairs), None)

    def cache_layout(self) -> CacheLayout:
        """`decoder_layers` layers of `decoder_attention_heads` heads."""
        decoder = self.model.decoder
        attn = decoder.layers[0].self_attn
        dtype = decoder.embed_tokens.weight.dtype
        return CacheLayout(len(decoder.layers), attn.num_heads, attn.head_dim, dtype)

    def decode(
        self, ids: Array, positions: Array, cache: KVCache, cross: CrossKV
    ) -> tuple[Array, KVCache]:
        """The decoder's last hidden states over new tokens (see `Seq2SeqLM.decode`)."""
        hidden, out = self.model.decoder(
            ids, positions, cache.mask(ids.shape[1], None), cross=(cross.keys, cross.values),
            cache=cache,
        )  # fmt: skip
        assert out is not None
        return hidden, out

    def decoder_start_token_id(self) -> int | None:
        """The config's `decoder_start_token_id` (50257 by default), else `bos_token_id`."""
        v = whisper_values(type(self).__name__, self.config)
        start = v["decoder_start_token_id"]
        start = v["bos_token_id"] if start is None else start
        return None if start is None else int(start)

    def max_positions(self) -> tuple[str, int] | None:
        """`("max_target_positions", limit)`: the decoder's learned positions."""
        return "max_target_positions", int(self.model.decoder.embed_positions.weight.shape[0])
