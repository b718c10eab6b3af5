"""MPNet: `MPNetModel` and its heads (masked LM, sequence and token classification).

A BERT-like encoder whose attention adds a relative position bias: one table
(`encoder.relative_attention_bias`, buckets by heads) shared by every layer, looked up once per
call with T5's bucketing of `key position - query position` (32 buckets, half for each
direction, exact below 8, logarithmic up to 128). As in `transformers`, the bias counts
positions `0..seq-1` whatever `position_ids` or padding say, and always 32 buckets, whatever
`relative_attention_num_buckets` is (a table with fewer rows is refused). The padding id of the
embeddings and of the default positions is 1, fixed by `transformers`' MPNet whatever
`pad_token_id` says. No token types.
"""

# exports: MPNetModel, MPNetForMaskedLM, MPNetForSequenceClassification, MPNetForTokenClassification  # noqa: E501

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import attend, projection_keys, split_key
from ._axis_layouts import attention_in, attention_out
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert import encoder_inputs
from ._bert_heads import EncoderWithHead, TokenClassification
from ._bert_layers import (
    BertIntermediate,
    BertPooler,
    BertSelfOutput,
    ClassificationHead,
    LMHead,
    WordPositionEmbeddings,
    check_ids,
    make_classification_head,
    make_lm_head,
)
from ._config_values import Value, read_config
from ._hf_activations import hf_activation

__all__ = [
    "MPNetForMaskedLM",
    "MPNetForSequenceClassification",
    "MPNetForTokenClassification",
    "MPNetModel",
    "relative_position_bucket",
]

_VALUES: dict[str, Value] = {
    "vocab_size": Value(30527, "size"),
    "hidden_size": Value(768, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "intermediate_size": Value(3072, "size"),
    "hidden_act": Value("gelu"),
    "hidden_dropout_prob": Value(0.1, "prob"),
    "attention_probs_dropout_prob": Value(0.1, "prob"),
    "max_position_embeddings": Value(512, "size"),
    "layer_norm_eps": Value(1e-12, "positive"),
    "relative_attention_num_buckets": Value(32, "size"),
    "tie_word_embeddings": Value(True, "bool"),
}
_PAD = 1  # transformers' MPNetEmbeddings.padding_idx
_BUCKETS, _MAX_DISTANCE = 32, 128  # what transformers' MPNetEncoder computes with


_SPAN = 128  # transformers' max_distance for MPNet's buckets


def relative_position_bucket(relative: np.ndarray) -> np.ndarray:
    """`transformers`' `MPNetEncoder.relative_position_bucket` (32 buckets, max distance 128),
    in its float32 arithmetic, for `key position - query position`."""
    half = _BUCKETS // 2
    n = -relative
    bucket = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    # The logarithm is used only from `exact` on; 1 keeps log(0) out of the small distances.
    scaled = np.log(np.maximum(n, 1).astype(np.float32) / np.float32(exact)) / np.float32(
        math.log(_MAX_DISTANCE / exact)
    )
    large = exact + (scaled * np.float32(half - exact)).astype(np.int64)
    large = np.minimum(large, half - 1)
    return bucket + np.where(n < exact, n, large)


@axis_names({**attention_in("q", "k", "v"), **attention_out("o")})
class MPNetSelfAttention(Module):
    """`q`, `k`, `v`, the attention with the position bias, and `o`."""

    q: nn.Linear
    k: nn.Linear
    v: nn.Linear
    o: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(
        self, x: Array, mask: Array | None, bias: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` to the same shape; `bias` `(1, heads, seq, seq)`."""
        b, s, _ = x.shape
        *keys, k_out = projection_keys(key, 4)
        q, k, v = (
            p(x, key=pk).reshape(b, s, self.num_heads, -1)
            for p, pk in zip((self.q, self.k, self.v), keys, strict=True)
        )
        scale = q.shape[-1] ** -0.5
        out = attend(q, k, v, mask, scale=scale, bias=bias, dropout=self.dropout, key=key,
                     scores="input")  # fmt: skip
        result: Array = self.o(out.reshape(b, s, -1), key=k_out)
        return result


class MPNetAttention(Module):
    """`attn`, dropout, and the residual added before `LayerNorm`."""

    attn: MPNetSelfAttention
    LayerNorm: nn.LayerNorm  # noqa: N815 (transformers' name)
    dropout: nn.Dropout

    def __call__(
        self, x: Array, mask: Array | None, bias: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """The attention block's output `(batch, seq, hidden)`."""
        k1, k2 = split_key(key, 2)
        return self.LayerNorm(self.dropout(self.attn(x, mask, bias, key=k1), key=k2) + x)


class MPNetLayer(Module):
    """One layer: attention, then BERT's feed-forward block."""

    attention: MPNetAttention
    intermediate: BertIntermediate
    output: BertSelfOutput

    def __call__(
        self, x: Array, mask: Array | None, bias: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        (k_inner,) = projection_keys(key, 1)
        h = self.attention(x, mask, bias, key=k1)
        return self.output(self.intermediate(h, key=k_inner), h, key=k2)


@axis_names({"relative_attention_bias.weight": None})
class MPNetEncoder(Module):
    """The layers (`layer`, one `nn.Stack`) and the bias table they share."""

    layer: nn.Stack
    relative_attention_bias: nn.Embedding

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """Run every layer with the position bias of `0..seq-1`."""
        s = x.shape[1]
        # From distance 128 on every distance shares its direction's last bucket: a table over
        # -128..128 serves any length (a symbolic one under jax.export).
        index = jax.lax.iota(jnp.int32, s)
        relative = jnp.clip(index[None, :] - index[:, None], -_SPAN, _SPAN)
        buckets = jnp.asarray(relative_position_bucket(np.arange(-_SPAN, _SPAN + 1)))
        bias = self.relative_attention_bias(buckets[relative + _SPAN])  # (seq, seq, heads)
        bias = jnp.transpose(bias, (2, 0, 1))[None].astype(x.dtype)
        out: Array = self.layer(x, mask, bias, key=key)
        return out


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> MPNetLayer:
    hidden, inner, eps = c["hidden_size"], c["intermediate_size"], c["layer_norm_eps"]
    ks = jax.random.split(key, 6)
    q, k, v, o = (nn.Linear(hidden, hidden, dtype=dtype, key=k) for k in ks[:4])
    drop = nn.Dropout(c["hidden_dropout_prob"], inference=True)
    attn = MPNetSelfAttention(
        q=q,
        k=k,
        v=v,
        o=o,
        dropout=nn.Dropout(c["attention_probs_dropout_prob"], inference=True),
        num_heads=c["num_attention_heads"],
    )
    return MPNetLayer(
        attention=MPNetAttention(attn, nn.LayerNorm(hidden, eps=eps, dtype=dtype), drop),
        intermediate=BertIntermediate(
            dense=nn.Linear(hidden, inner, dtype=dtype, key=ks[4]), act=c["hidden_act"]
        ),
        output=BertSelfOutput(
            dense=nn.Linear(inner, hidden, dtype=dtype, key=ks[5]),
            LayerNorm=nn.LayerNorm(hidden, eps=eps, dtype=dtype),
            dropout=drop,
        ),
    )


@register_architecture
class MPNetModel(PretrainedModel):
    """MPNet's encoder (`transformers.MPNetModel`, with its pooler): `last_hidden_state`.

    Called with `input_ids` `(batch, seq)` (or `inputs_embeds`), optionally `attention_mask`
    (1 to attend, 0 for padding) and `position_ids` (default: counted over the tokens that are
    not 1, from 2, as RoBERTa's).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.mpnet import MPNetModel
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = MPNetModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 5, 2]])).shape
        (1, 3, 16)
        >>> model.encoder.relative_attention_bias.weight.shape   # one table for both layers
        (32, 2)
    """

    architecture = "MPNetModel"
    model_type = "mpnet"
    base_model_prefix = "mpnet"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ("position_ids",)

    embeddings: WordPositionEmbeddings
    encoder: MPNetEncoder
    pooler: BertPooler | None

    @classmethod
    def read(cls, owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The `MPNetConfig` values, checked; refused ones raise `CheckpointError`."""
        c = read_config(owner, config, _VALUES)
        hf_activation(owner, "hidden_act", c["hidden_act"])
        if c["hidden_size"] % c["num_attention_heads"]:
            raise config_error(
                owner,
                "num_attention_heads",
                c["num_attention_heads"],
                f"a divisor of hidden_size={c['hidden_size']}",
            )
        for key in ("vocab_size", "max_position_embeddings"):
            if c[key] <= _PAD:
                raise config_error(owner, key, c[key], f"more than {_PAD}, MPNet's padding id")
        buckets = c["relative_attention_num_buckets"]
        if buckets < _BUCKETS:
            raise config_error(
                owner,
                "relative_attention_num_buckets",
                buckets,
                f"at least {_BUCKETS}: transformers' MPNet looks up {_BUCKETS} buckets",
            )
        return c

    @classmethod
    def build(
        cls,
        config: PretrainedConfig,
        c: dict[str, Any],
        key: PRNGKeyArray,
        dtype: Any,
        pooler: bool,
    ) -> Self:
        """The model with random weights from the read values `c` (`pooler`: with the pooler)."""
        hidden = c["hidden_size"]
        k_word, k_pos, k_bias, k_layers, k_pool = jax.random.split(key, 5)

        def padded(n: int, k: PRNGKeyArray) -> nn.Embedding:
            table = nn.Embedding(n, hidden, dtype=dtype, key=k)
            return nn.Embedding(weight=table.weight.at[_PAD].set(0))  # PyTorch's padding_idx

        embeddings = WordPositionEmbeddings(
            padded(c["vocab_size"], k_word),
            padded(c["max_position_embeddings"], k_pos),
            nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
            nn.Dropout(c["hidden_dropout_prob"], inference=True),
        )
        encoder = MPNetEncoder(
            layer=nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=k_layers),
            relative_attention_bias=nn.Embedding(
                c["relative_attention_num_buckets"],
                c["num_attention_heads"],
                dtype=dtype,
                key=k_bias,
            ),  # fmt: skip
        )
        pool = None
        if pooler:
            pool = BertPooler(dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_pool))
        return cls(config=config, embeddings=embeddings, encoder=encoder, pooler=pool)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
        add_pooling_layer: bool = True,
    ) -> Self:
        """Build the model with random weights from an `MPNetConfig` dict.

        Arguments:
            config: the config; keys it lacks take `MPNetConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).
            add_pooling_layer: build the pooler (`transformers`' argument of the same name).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        return cls.build(config, cls.read(cls.__name__, config), key, dtype, add_pooling_layer)

    def hidden_states(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last layer's hidden states `(batch, seq, hidden)` (`last_hidden_state`); the
        model's call (the heads call it on their body).

        Arguments:
            input_ids: token ids `(batch, seq)`; or give `inputs_embeds` instead.
            attention_mask: `(batch, seq)`, 1 for tokens to attend to, 0 for padding.
            position_ids: the position embeddings' positions `(batch, seq)` or `(1, seq)`.
            inputs_embeds: word embeddings `(batch, seq, hidden)` instead of `input_ids`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, hidden)`.
        """
        name = type(self).__name__
        k_emb, k_enc = split_key(key, 2)
        words, shape, positions = encoder_inputs(self, input_ids, inputs_embeds, position_ids, _PAD)
        x = self.embeddings(words, positions, key=k_emb)
        mask = None
        if attention_mask is not None:
            mask = check_ids(name, "attention_mask", attention_mask, shape)
            assert mask is not None
            mask = mask.astype(bool)[:, None, None, :]
        return self.encoder(x, mask, key=k_enc)

    __call__ = hidden_states  # as BertModel's


class _MPNetHeads(EncoderWithHead):
    """MPNet's body under MPNet's name, for its heads."""

    model_type = "mpnet"
    base_model_prefix = "mpnet"
    body = MPNetModel


@register_architecture
class MPNetForMaskedLM(_MPNetHeads):
    """MPNet with its masked-LM head (`transformers.MPNetForMaskedLM`): `logits`.

    `lm_head` as RoBERTa's (dense, exact GELU, `layer_norm`, the projection tied to the word
    embeddings and `lm_head.bias` by default, see `tied_weights()`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.mpnet import MPNetForMaskedLM
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = MPNetForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3, 50)
    """

    architecture = "MPNetForMaskedLM"

    mpnet: MPNetModel
    lm_head: LMHead

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`lm_head`, with a decoder only when untied."""
        tied = c["tie_word_embeddings"]
        hidden, vocab, eps = c["hidden_size"], c["vocab_size"], c["layer_norm_eps"]
        return {"lm_head": make_lm_head(hidden, vocab, eps, tied, dtype, key)}

    def tied_weights(self) -> dict[str, str]:
        """`lm_head.decoder.{weight,bias}` share the word embeddings and `lm_head.bias`."""
        if self.lm_head.decoder is not None:
            return {}
        return {
            "lm_head.decoder.weight": "mpnet.embeddings.word_embeddings.weight",
            "lm_head.decoder.bias": "lm_head.bias",
        }

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`."""
        return self.lm_head(hidden, self.mpnet.embeddings.word_embeddings.weight, key=key)


@register_architecture
class MPNetForSequenceClassification(_MPNetHeads):
    """MPNet with its classification head (`transformers.MPNetForSequenceClassification`).

    No pooler: `classifier` (dense, tanh, `out_proj` on the first token, dropout
    `hidden_dropout_prob`), as RoBERTa's. Returns `logits` `(batch, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.mpnet import MPNetForSequenceClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 3}
        >>> model = MPNetForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3)
    """

    architecture = "MPNetForSequenceClassification"
    labels = True

    mpnet: MPNetModel
    classifier: ClassificationHead

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`classifier`: dense, dropout, out_proj."""
        p = c["hidden_dropout_prob"]
        head = make_classification_head(c["hidden_size"], c["num_labels"], p, dtype, key)
        return {"classifier": head}

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """`(batch, num_labels)` from the first token."""
        return self.classifier(hidden, key=key)


@register_architecture
class MPNetForTokenClassification(TokenClassification, _MPNetHeads):
    """MPNet with a classifier on every token (`transformers.MPNetForTokenClassification`):
    dropout (`hidden_dropout_prob`) and `classifier`; returns `(batch, seq, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.mpnet import MPNetForTokenClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 4}
        >>> model = MPNetForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3, 4)
    """

    architecture = "MPNetForTokenClassification"
    dropout_key = "hidden_dropout_prob"

    mpnet: MPNetModel
