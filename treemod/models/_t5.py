"""T5: `T5Model`, `T5ForConditionalGeneration`, `T5EncoderModel` from Hugging Face config dicts.

One token embedding (`shared`) feeds the encoder and the decoder (`encoder.embed_tokens` and
`decoder.embed_tokens` are its aliases in `tied_weights`). Original T5 ties the head to it and
scales the decoder's output by `d_model**-0.5`; T5 v1.1 and flan-t5 (`tie_word_embeddings:
false`, or `scale_decoder_outputs: false` as `transformers` 5 writes them) have their own
`lm_head` and no scaling. Models are built in inference mode (dropout off), as `transformers`'
`from_pretrained` returns them; `tm.nn.inference_mode(model, False)` and a call's `key=` turn
dropout on.
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
from treemod.models._attention_parts import causal_mask, projection_keys, split_key, token_inputs
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
from treemod.models._t5_layers import T5Stack, build_stack

__all__ = [
    "CROSS_BIAS",
    "T5_VALUES",
    "T5EncoderModel",
    "T5ForConditionalGeneration",
    "T5Model",
    "shift_right",
    "t5_values",
]

T5_VALUES: dict[str, Value] = {
    "vocab_size": Value(32128, "size"),
    "d_model": Value(512, "size"),
    "d_kv": Value(64, "size"),
    "d_ff": Value(2048, "size"),
    "num_layers": Value(6, "size"),
    "num_decoder_layers": Value(None, "size", nullable=True),
    "num_heads": Value(8, "size"),
    "relative_attention_num_buckets": Value(32, "size"),
    "relative_attention_max_distance": Value(128, "size"),
    "dropout_rate": Value(0.1, "dropout"),
    "layer_norm_epsilon": Value(1e-6, "positive"),
    "initializer_factor": Value(1.0, "positive"),
    "feed_forward_proj": Value("relu"),
    "is_encoder_decoder": Value(True, "bool"),
    "is_decoder": Value(False, "bool"),
    "use_cache": Value(True, "bool"),
    "pad_token_id": Value(0, "count", nullable=True),
    "eos_token_id": Value(1),
    "decoder_start_token_id": Value(None, "count", nullable=True),
    "classifier_dropout": Value(0.0, "dropout"),
    "tie_word_embeddings": Value(None, "bool", nullable=True),
    "scale_decoder_outputs": Value(None, "bool", nullable=True),
}
"""The values `T5Config` reads, with its defaults (`tie_word_embeddings` absent reads as tied)."""

_ALIASES = {
    "hidden_size": "d_model",
    "num_attention_heads": "num_heads",
    "num_hidden_layers": "num_layers",
    "head_dim": "d_kv",
}
CROSS_BIAS = r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight"


def t5_values(owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The config read as `T5Config` reads it, checked, with the derived values set."""
    v = read_config(owner, config, T5_VALUES, _ALIASES)
    if v["num_decoder_layers"] is None:
        v["num_decoder_layers"] = v["num_layers"]
    proj = v["feed_forward_proj"]
    parts = proj.split("-") if isinstance(proj, str) else []
    if not parts or len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated"):
        raise config_error(owner, "feed_forward_proj", proj, "'<act>' or 'gated-<act>'")
    # T5Config derives these from feed_forward_proj unless config.json holds them.
    act = "gelu_new" if proj == "gated-gelu" else parts[-1]
    v["dense_act_fn"] = v.get("dense_act_fn", act)
    v["is_gated_act"] = v.get("is_gated_act", parts[0] == "gated")
    hf_activation(owner, "dense_act_fn", v["dense_act_fn"])
    if not isinstance(v["is_gated_act"], bool):
        raise config_error(owner, "is_gated_act", v["is_gated_act"], "true or false")
    buckets = v["relative_attention_num_buckets"]
    if buckets < 4:
        raise config_error(owner, "relative_attention_num_buckets", buckets, "an integer >= 4")
    distance = v["relative_attention_max_distance"]
    if distance <= buckets // 2:
        raise config_error(
            owner,
            "relative_attention_max_distance",
            distance,
            f"an integer above relative_attention_num_buckets // 2 = {buckets // 2}",
        )
    # transformers 5 ties the head unless the file's differs; tie_word_embeddings: false (or
    # the scale_decoder_outputs: false it writes for such models) marks those files.
    scale = v["scale_decoder_outputs"]
    v["scale"] = v["tie_word_embeddings"] is not False if scale is None else scale
    return v


def _embedding(v: Mapping[str, Any], dtype: Any, key: PRNGKeyArray) -> nn.Embedding:
    init = nn.init.normal(v["initializer_factor"])
    return nn.Embedding(v["vocab_size"], v["d_model"], dtype=dtype, weight_init=init, key=key)


def _encoder_mask(mask: Array | None) -> Array | None:
    return None if mask is None else mask[:, None, None, :]


def shift_right(owner: str, labels: Array, v: Mapping[str, Any]) -> Array:
    """`labels` moved one step right after `decoder_start_token_id`, -100 made `pad_token_id`."""
    start, pad = v["decoder_start_token_id"], v["pad_token_id"]
    if start is None or pad is None:
        name = "decoder_start_token_id" if start is None else "pad_token_id"
        raise ValueError(
            f"{owner}: `labels` without `decoder_input_ids` are shifted right after the "
            f"config's decoder_start_token_id, with -100 made pad_token_id; the config has no "
            f"{name}. Pass decoder_input_ids."
        )
    shifted = jnp.concatenate([jnp.full_like(labels[:, :1], start), labels[:, :-1]], axis=1)
    return jnp.where(shifted == -100, pad, shifted)


class _T5Base(PretrainedModel):
    """What the T5 classes share: the config reading and the encoder pass."""

    model_type: ClassVar[str] = "t5"
    shared: nn.Embedding
    encoder: T5Stack

    @classmethod
    def _read(cls, config: Mapping[str, Any] | PretrainedConfig) -> tuple[PretrainedConfig, Any]:
        config = PretrainedConfig(config)
        return config, t5_values(cls.__name__, config)

    def _encode(self, input_ids: Any, attention_mask: Any, key: PRNGKeyArray | None) -> Encoded:
        ids, mask, _ = token_inputs(type(self).__name__, input_ids, attention_mask, None)
        seq = ids.shape[1]
        hidden, _ = self.encoder(
            self.shared(ids), _encoder_mask(mask), jax.lax.iota(jnp.int32, seq), key=key
        )
        return Encoded(hidden, mask)


class _T5EncoderDecoder(_T5Base):
    decoder: T5Stack

    def _decode(
        self,
        encoded: Encoded,
        decoder_input_ids: Any,
        decoder_attention_mask: Any,
        key: PRNGKeyArray | None,
    ) -> Array:
        owner = type(self).__name__
        if decoder_input_ids is None:
            raise ValueError(f"{owner}: pass `decoder_input_ids=` (or `labels=` to shift right).")
        ids, mask, _ = token_inputs(owner, decoder_input_ids, decoder_attention_mask, None)
        seq = ids.shape[1]
        hidden, _ = self.decoder(
            self.shared(ids),
            causal_mask(seq, mask),
            jax.lax.iota(jnp.int32, seq),
            cross_mask=_encoder_mask(encoded.mask),
            states=encoded.hidden,
            key=key,
        )
        return hidden

    @classmethod
    def _parts(cls, v: Any, key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        dtype = jnp.float32 if dtype is None else dtype
        k_shared, k_enc, k_dec = jax.random.split(key, 3)
        return {
            "shared": _embedding(v, dtype, k_shared),
            "encoder": build_stack(v, False, dtype, key=k_enc),
            "decoder": build_stack(v, True, dtype, key=k_dec),
        }


@register_architecture
class T5Model(_T5EncoderDecoder):
    """The T5 encoder-decoder without a head: returns the decoder's `last_hidden_state`.

    Called with `input_ids` `(batch, src)`, `attention_mask` (1 for tokens, 0 for padding, on
    either side), `decoder_input_ids` `(batch, tgt)`, `decoder_attention_mask`, and `key` for
    dropout in training mode.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5Model
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        ...           "num_heads": 4}
        >>> model = T5Model.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), decoder_input_ids=jnp.array([[0, 4]])).shape
        (1, 2, 16)
    """

    architecture: ClassVar[str] = "T5Model"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (CROSS_BIAS,)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights (`transformers`' initialisation) from a config dict.

        Arguments:
            config: the `config.json` dict; absent keys take `T5Config`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (float32 by default).

        Returns:
            The model, in inference mode.
        """
        config, v = cls._read(config)
        return cls(config=config, **cls._parts(v, key, dtype))

    def tied_weights(self) -> dict[str, str]:
        """Both stacks' `embed_tokens.weight` are `shared.weight`."""
        return {f"{s}.embed_tokens.weight": "shared.weight" for s in ("encoder", "decoder")}

    def __call__(
        self,
        *,
        input_ids: Any,
        decoder_input_ids: Any,
        attention_mask: Any = None,
        decoder_attention_mask: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The decoder's last hidden state `(batch, tgt, d_model)`.

        Arguments:
            input_ids: `(batch, src)` encoder token ids.
            decoder_input_ids: `(batch, tgt)` decoder token ids.
            attention_mask: `(batch, src)`, 1 for tokens and 0 for padding.
            decoder_attention_mask: `(batch, tgt)`, likewise.
            key: PRNG key for dropout (training mode only).

        Returns:
            `last_hidden_state`.
        """
        k_enc, k_dec = split_key(key, 2)
        encoded = self._encode(input_ids, attention_mask, k_enc)
        return self._decode(encoded, decoder_input_ids, decoder_attention_mask, k_dec)


@register_architecture
@axis_names(vocab_head("lm_head"))
class T5ForConditionalGeneration(_T5EncoderDecoder, Seq2SeqLM):
    """T5 with its language-modelling head: returns `logits`; generates with `generate_seq2seq`.

    `lm_head` is `None` when tied to `shared` (the decoder's output then scaled by
    `d_model**-0.5`), else a bias-free `nn.Linear`. Inputs as `T5Model`'s, or `labels` instead
    of `decoder_input_ids` (shifted right after `decoder_start_token_id`, as `transformers`
    does; the loss is left to the caller).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5ForConditionalGeneration
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        ...           "num_heads": 4, "decoder_start_token_id": 0}
        >>> model = T5ForConditionalGeneration.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), labels=jnp.array([[5, 6]])).shape
        (1, 2, 50)
        >>> sorted(model.tied_weights())[-1]
        'lm_head.weight'
    """

    architecture: ClassVar[str] = "T5ForConditionalGeneration"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (CROSS_BIAS,)
    encoder_inputs: ClassVar[tuple[str, ...]] = ("input_ids", "attention_mask")

    lm_head: nn.Linear | None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights from a config dict (see `T5Model.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model, in inference mode.
        """
        config, v = cls._read(config)
        k_body, k_head = jax.random.split(key)
        head = None
        if not v["scale"]:
            init = nn.init.normal(v["initializer_factor"])
            head = nn.Linear(
                v["d_model"], v["vocab_size"], False, dtype or jnp.float32, weight_init=init,
                key=k_head,
            )  # fmt: skip
        return cls(config=config, lm_head=head, **cls._parts(v, k_body, dtype))

    def tied_weights(self) -> dict[str, str]:
        """`embed_tokens.weight` of both stacks, and `lm_head.weight` when tied, are `shared`'s."""
        tied = {f"{s}.embed_tokens.weight": "shared.weight" for s in ("encoder", "decoder")}
        if self.lm_head is None:
            tied["lm_head.weight"] = "shared.weight"
        return tied

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The head over decoder states `(..., d_model)`: scaled and tied, or `lm_head` (`key`:
        its key, for LoRA dropout)."""
        if self.lm_head is not None:
            return self.lm_head(hidden, key=key)
        hidden = hidden * jnp.asarray(self.shared.weight.shape[1] ** -0.5, hidden.dtype)
        return jnp.einsum("...d,vd->...v", hidden, self.shared.weight)

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        decoder_input_ids: Any = None,
        decoder_attention_mask: Any = None,
        labels: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The logits `(batch, tgt, vocab_size)`.

        Arguments:
            input_ids: `(batch, src)` encoder token ids.
            attention_mask: `(batch, src)`, 1 for tokens and 0 for padding.
            decoder_input_ids: `(batch, tgt)` decoder token ids.
            decoder_attention_mask: `(batch, tgt)`, likewise.
            labels: `(batch, tgt)` targets, shifted right into `decoder_input_ids` when those
                are not given (-100 marks ignored targets).
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        if decoder_input_ids is None and labels is not None:
            owner = type(self).__name__
            ids, _, _ = token_inputs(owner, labels, None, None)
            decoder_input_ids = shift_right(owner, ids, t5_values(owner, self.config))
        k_enc, k_dec = split_key(key, 2)
        encoded = self._encode(input_ids, attention_mask, k_enc)
        hidden = self._decode(encoded, decoder_input_ids, decoder_attention_mask, k_dec)
        return self.logits(hidden, key=projection_keys(key, 1)[0])

    # The contract generate_seq2seq reads (Seq2SeqLM).

    def encoder_arrays(self, owner: str, inputs: dict[str, Any]) -> dict[str, Array]:
        """`input_ids` and `attention_mask` checked (`token_inputs`)."""
        ids, mask, _ = token_inputs(
            owner, inputs.get("input_ids"), inputs.get("attention_mask"), None
        )
        return {"input_ids": ids} if mask is None else {"input_ids": ids, "attention_mask": mask}

    def encode(self, inputs: dict[str, Array]) -> Encoded:
        """The encoder's last hidden states and the input's mask."""
        return self._encode(inputs["input_ids"], inputs.get("attention_mask"), None)

    def cross_kv(self, encoded: Encoded) -> CrossKV:
        """Each decoder block's `EncDecAttention` keys and values over the encoder's states."""
        pairs = [b.layer[1].EncDecAttention.keys_values(encoded.hidden) for b in self.decoder.block]
        return CrossKV(
            tuple(k for k, _ in pairs), tuple(v for _, v in pairs), _encoder_mask(encoded.mask)
        )

    def cache_layout(self) -> CacheLayout:
        """`num_decoder_layers` layers of `num_heads` heads of `d_kv`."""
        attn = self.decoder.block[0].layer[0].SelfAttention
        dtype = self.shared.weight.dtype
        return CacheLayout(len(self.decoder.block), attn.n_heads, attn.d_kv, dtype)

    def decode(
        self, ids: Array, positions: Array, cache: KVCache, cross: CrossKV
    ) -> tuple[Array, KVCache]:
        """The decoder's last hidden states over new tokens (see `Seq2SeqLM.decode`)."""
        q_len = ids.shape[1]
        hidden, out = self.decoder(
            self.shared(ids),
            cache.mask(q_len, None),
            cache.offset + jnp.arange(q_len),
            cross_mask=cross.mask,
            cross=(cross.keys, cross.values),
            cache=cache,
        )
        assert out is not None
        return hidden, out

    def decoder_start_token_id(self) -> int | None:
        """The config's `decoder_start_token_id`, else its `bos_token_id` (as `generate`)."""
        start = self.config.get("decoder_start_token_id")
        start = self.config.get("bos_token_id") if start is None else start
        return None if start is None else int(start)


@register_architecture
class T5EncoderModel(_T5Base):
    """T5's encoder alone: returns its `last_hidden_state` `(batch, seq, d_model)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5EncoderModel
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 2,
        ...           "num_heads": 4, "feed_forward_proj": "gated-gelu"}
        >>> model = T5EncoderModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 16)
    """

    architecture: ClassVar[str] = "T5EncoderModel"
    # transformers skips every name holding "decoder" (the whole decoder of a full T5 file).
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (r"decoder\..*",)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build with random weights from a config dict (see `T5Model.from_config`).

        Arguments:
            config: the `config.json` dict.
            key: the PRNG key.
            dtype: the parameters' dtype.

        Returns:
            The model, in inference mode.
        """
        config, v = cls._read(config)
        if v["is_decoder"]:
            # transformers' T5EncoderModel then builds a causal stack with cross-attention.
            raise config_error(cls.__name__, "is_decoder", True, "false (an encoder)")
        dtype = jnp.float32 if dtype is None else dtype
        k_shared, k_enc = jax.random.split(key)
        return cls(
            config=config,
            shared=_embedding(v, dtype, k_shared),
            encoder=build_stack(v, False, dtype, key=k_enc),
        )

    def tied_weights(self) -> dict[str, str]:
        """`encoder.embed_tokens.weight` is `shared.weight`."""
        return {"encoder.embed_tokens.weight": "shared.weight"}

    def __call__(
        self, *, input_ids: Any, attention_mask: Any = None, key: PRNGKeyArray | None = None
    ) -> Array:
        """The encoder's last hidden state.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            key: PRNG key for dropout (training mode only).

        Returns:
            `last_hidden_state`.
        """
        return self._encode(input_ids, attention_mask, key).hidden
