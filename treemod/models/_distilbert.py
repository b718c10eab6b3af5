"""DistilBERT: `DistilBertModel` and its heads (masked LM, sequence and token classification).

`transformers`' names: `embeddings` (word and position, no token types), `transformer.layer.{i}`
with `attention.{q,k,v,out}_lin`, `sa_layer_norm`, `ffn.lin1/lin2`, `output_layer_norm`, every
LayerNorm at eps 1e-12. `sinusoidal_pos_embds` only initialises the position table (as
`transformers`' `_init_weights`, the table stays a parameter that a checkpoint overwrites), so it
is implemented: `from_config` fills the table with those sines and cosines. Built in inference
mode, as `BertModel` (`tm.nn.inference_mode(model, False)` turns dropout on).
"""

# exports: DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification, DistilBertForTokenClassification  # noqa: E501

from __future__ import annotations

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

from ._attention_parts import projection_keys, split_key
from ._axis_layouts import attention_in, attention_out, mlp_out, vocab_head
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert import encoder_inputs
from ._bert_heads import EncoderWithHead, TokenClassification
from ._bert_layers import (
    WordPositionEmbeddings,
    attend_encoder,
    attention_bias,
    vocab_logits,
)
from ._config_values import Value, read_config
from ._hf_activations import get_activation, hf_activation

__all__ = [
    "DistilBertForMaskedLM",
    "DistilBertForSequenceClassification",
    "DistilBertForTokenClassification",
    "DistilBertModel",
]

_VALUES: dict[str, Value] = {
    "vocab_size": Value(30522, "size"),
    "max_position_embeddings": Value(512, "size"),
    "sinusoidal_pos_embds": Value(False, "bool"),
    "n_layers": Value(6, "size"),
    "n_heads": Value(12, "size"),
    "dim": Value(768, "size"),
    "hidden_dim": Value(4 * 768, "size"),
    "dropout": Value(0.1, "prob"),
    "attention_dropout": Value(0.1, "prob"),
    "activation": Value("gelu"),
    "seq_classif_dropout": Value(0.2, "prob"),
    "pad_token_id": Value(0),
    "tie_word_embeddings": Value(True, "bool"),
}
_ALIASES = {"hidden_size": "dim", "num_attention_heads": "n_heads", "num_hidden_layers": "n_layers"}
_EPS = 1e-12  # transformers' DistilBERT fixes every LayerNorm's eps


def sinusoidal_table(n_pos: int, dim: int) -> np.ndarray:
    """`transformers`' `create_sinusoidal_embeddings`: sin on even columns, cos on odd ones."""
    pos = np.arange(n_pos, dtype=np.float64)[:, None]
    j = np.arange(dim)
    angles = pos / np.power(10000, 2 * (j // 2) / dim)
    table = np.empty((n_pos, dim), np.float32)
    table[:, 0::2] = np.sin(angles[:, 0::2])
    table[:, 1::2] = np.cos(angles[:, 1::2])
    return table


@axis_names({**attention_in("q_lin", "k_lin", "v_lin"), **attention_out("out_lin")})
class DistilBertSelfAttention(Module):
    """`q_lin`, `k_lin`, `v_lin`, the attention, and `out_lin`."""

    q_lin: nn.Linear
    k_lin: nn.Linear
    v_lin: nn.Linear
    out_lin: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, dim)` to the same shape."""
        b, s, _ = x.shape
        *keys, k_out = projection_keys(key, 4)
        q, k, v = (
            p(x, key=pk).reshape(b, s, self.num_heads, -1)
            for p, pk in zip((self.q_lin, self.k_lin, self.v_lin), keys, strict=True)
        )
        out: Array = self.out_lin(
            attend_encoder(q, k, v, bias, self.dropout, key=key).reshape(b, s, -1), key=k_out
        )
        return out


@axis_names(mlp_out("lin2"))
class FFN(Module):
    """`lin1`, the activation, `lin2`, dropout."""

    lin1: nn.Linear
    lin2: nn.Linear
    dropout: nn.Dropout
    activation: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, dim)` to the same shape."""
        k1, k2 = projection_keys(key, 2)
        h = get_activation(self.activation)(self.lin1(x, key=k1))
        return self.dropout(self.lin2(h, key=k2), key=key)


class TransformerBlock(Module):
    """One layer: attention, then the feed-forward block, each post-normed."""

    attention: DistilBertSelfAttention
    sa_layer_norm: nn.LayerNorm
    ffn: FFN
    output_layer_norm: nn.LayerNorm

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, dim)` to the same shape."""
        k1, k2 = split_key(key, 2)
        h = self.sa_layer_norm(self.attention(x, bias, key=k1) + x)
        return self.output_layer_norm(self.ffn(h, key=k2) + h)


class Transformer(Module):
    """The layers, one `nn.Stack` (`transformer.layer.{i}`)."""

    layer: nn.Stack

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """Run every layer."""
        out: Array = self.layer(x, bias, key=key)
        return out


def _block(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> TransformerBlock:
    dim, hidden = c["dim"], c["hidden_dim"]
    ks = jax.random.split(key, 6)
    q, k, v, out = (nn.Linear(dim, dim, dtype=dtype, key=k) for k in ks[:4])
    attention = DistilBertSelfAttention(
        q_lin=q,
        k_lin=k,
        v_lin=v,
        out_lin=out,
        dropout=nn.Dropout(c["attention_dropout"], inference=True),
        num_heads=c["n_heads"],
    )
    ffn = FFN(
        lin1=nn.Linear(dim, hidden, dtype=dtype, key=ks[4]),
        lin2=nn.Linear(hidden, dim, dtype=dtype, key=ks[5]),
        dropout=nn.Dropout(c["dropout"], inference=True),
        activation=c["activation"],
    )
    return TransformerBlock(
        attention,
        nn.LayerNorm(dim, eps=_EPS, dtype=dtype),
        ffn,
        nn.LayerNorm(dim, eps=_EPS, dtype=dtype),
    )


@register_architecture
class DistilBertModel(PretrainedModel):
    """DistilBERT's encoder (`transformers.DistilBertModel`): returns `last_hidden_state`.

    Called with `input_ids` `(batch, seq)` (or `inputs_embeds`), optionally `attention_mask`
    (1 to attend, 0 for padding) and `position_ids` (default `0..seq-1`); DistilBERT has no
    token types.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.distilbert import DistilBertModel
        >>> config = {"vocab_size": 50, "dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 32}
        >>> model = DistilBertModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), attention_mask=jnp.array([[1, 1, 0]])).shape
        (1, 3, 16)
        >>> model.transformer.layer.layers.attention.q_lin.weight.shape   # 2 stacked layers
        (2, 16, 16)
    """

    architecture = "DistilBertModel"
    model_type = "distilbert"
    base_model_prefix = "distilbert"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ("position_ids",)

    embeddings: WordPositionEmbeddings
    transformer: Transformer

    @classmethod
    def read(cls, owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The `DistilBertConfig` values, checked (`hidden_size` is `dim`, as its alias)."""
        c = read_config(owner, config, _VALUES, _ALIASES)
        hf_activation(owner, "activation", c["activation"])
        if c["dim"] % c["n_heads"]:
            raise config_error(owner, "n_heads", c["n_heads"], f"a divisor of dim={c['dim']}")
        pad = c["pad_token_id"]
        if pad is not None and not (
            isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < c["vocab_size"]
        ):
            raise config_error(owner, "pad_token_id", pad, "null or a token id below vocab_size")
        c["hidden_size"] = c["dim"]
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
        """The model with random weights from the read values `c` (DistilBERT has no pooler)."""
        dim = c["dim"]
        k_word, k_pos, k_layers = jax.random.split(key, 3)
        word = nn.Embedding(c["vocab_size"], dim, dtype=dtype, key=k_word)
        if c["pad_token_id"] is not None:  # PyTorch's padding_idx: that row starts at zero
            word = nn.Embedding(weight=word.weight.at[c["pad_token_id"]].set(0))
        position = nn.Embedding(c["max_position_embeddings"], dim, dtype=dtype, key=k_pos)
        if c["sinusoidal_pos_embds"]:
            table = sinusoidal_table(c["max_position_embeddings"], dim)
            position = nn.Embedding(weight=jnp.asarray(table, position.weight.dtype))
        embeddings = WordPositionEmbeddings(
            word,
            position,
            nn.LayerNorm(dim, eps=_EPS, dtype=dtype),
            nn.Dropout(c["dropout"], inference=True),
        )
        layers = nn.Stack(lambda k: _block(c, dtype, k), c["n_layers"], key=k_layers)
        return cls(config=config, embeddings=embeddings, transformer=Transformer(layer=layers))

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `DistilBertConfig` dict.

        Arguments:
            config: the config; keys it lacks take `DistilBertConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        return cls.build(config, cls.read(cls.__name__, config), key, dtype, False)

    def hidden_states(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last layer's hidden states `(batch, seq, dim)` (`last_hidden_state`); the
        model's call (the heads call it on their body).

        Arguments:
            input_ids: token ids `(batch, seq)`; or give `inputs_embeds` instead.
            attention_mask: `(batch, seq)`, 1 for tokens to attend to, 0 for padding.
            position_ids: positions `(batch, seq)` or `(1, seq)` (default `0..seq-1`).
            inputs_embeds: word embeddings `(batch, seq, dim)` instead of `input_ids`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, dim)`.
        """
        k_emb, k_enc = split_key(key, 2)
        words, shape, positions = encoder_inputs(self, input_ids, inputs_embeds, position_ids, None)
        x = self.embeddings(words, positions, key=k_emb)
        return self.transformer(x, attention_bias(attention_mask, shape, x.dtype), key=k_enc)

    __call__ = hidden_states  # as BertModel's


@axis_names({"bias": ("vocab",)})
class VocabBias(Module):
    """The tied `vocab_projector`: its weight is the word embeddings', its bias its own."""

    bias: Array


class _DistilBertHeads(EncoderWithHead):
    """DistilBERT's body under DistilBERT's name, for its heads."""

    model_type = "distilbert"
    base_model_prefix = "distilbert"
    body = DistilBertModel


@register_architecture
@axis_names(vocab_head("vocab_projector"))
class DistilBertForMaskedLM(_DistilBertHeads):
    """DistilBERT with its masked-LM head (`transformers.DistilBertForMaskedLM`): `logits`.

    `vocab_transform`, the activation, `vocab_layer_norm`, `vocab_projector`; with
    `tie_word_embeddings` (the default) the projector's weight is the word embeddings' array
    (`tied_weights()`) and its bias its own.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.distilbert import DistilBertForMaskedLM
        >>> config = {"vocab_size": 50, "dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32}
        >>> model = DistilBertForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 50)
        >>> model.tied_weights()
        {'vocab_projector.weight': 'distilbert.embeddings.word_embeddings.weight'}
    """

    architecture = "DistilBertForMaskedLM"

    distilbert: DistilBertModel
    vocab_transform: nn.Linear
    vocab_layer_norm: nn.LayerNorm
    vocab_projector: nn.Linear | VocabBias
    activation: str = field(static=True)

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """The transform, its LayerNorm and the projector (weight and bias untied, else bias)."""
        k_transform, k_proj = jax.random.split(key)
        dim, vocab = c["dim"], c["vocab_size"]
        projector: nn.Linear | VocabBias = nn.Linear(dim, vocab, dtype=dtype, key=k_proj)
        if c["tie_word_embeddings"]:
            assert projector.bias is not None
            projector = VocabBias(bias=projector.bias)
        return {
            "vocab_transform": nn.Linear(dim, dim, dtype=dtype, key=k_transform),
            "vocab_layer_norm": nn.LayerNorm(dim, eps=_EPS, dtype=dtype),
            "vocab_projector": projector,
            "activation": c["activation"],
        }

    def tied_weights(self) -> dict[str, str]:
        """`vocab_projector.weight` is the word embeddings' array when tied."""
        if isinstance(self.vocab_projector, nn.Linear):
            return {}
        return {"vocab_projector.weight": "distilbert.embeddings.word_embeddings.weight"}

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`."""
        k_transform, k_projector = projection_keys(key, 2)
        h = get_activation(self.activation)(self.vocab_transform(hidden, key=k_transform))
        h = self.vocab_layer_norm(h)
        projector = self.vocab_projector
        decoder = projector if isinstance(projector, nn.Linear) else None
        assert projector.bias is not None
        return vocab_logits(
            h,
            decoder,
            projector.bias,
            self.distilbert.embeddings.word_embeddings.weight,
            key=k_projector,
        )


@register_architecture
class DistilBertForSequenceClassification(_DistilBertHeads):
    """DistilBERT with its classifier (`transformers.DistilBertForSequenceClassification`).

    The first token through `pre_classifier`, ReLU, dropout (`seq_classif_dropout`) and
    `classifier`; labels counted as `transformers` counts them. Returns `(batch, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.distilbert import DistilBertForSequenceClassification
        >>> config = {"vocab_size": 50, "dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32}
        >>> model = DistilBertForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 2)
    """

    architecture = "DistilBertForSequenceClassification"
    labels = True

    distilbert: DistilBertModel
    pre_classifier: nn.Linear
    classifier: nn.Linear
    dropout: nn.Dropout

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`pre_classifier`, `classifier`, `dropout`."""
        k_pre, k_cls = jax.random.split(key)
        dim = c["dim"]
        return {
            "pre_classifier": nn.Linear(dim, dim, dtype=dtype, key=k_pre),
            "classifier": nn.Linear(dim, c["num_labels"], dtype=dtype, key=k_cls),
            "dropout": nn.Dropout(c["seq_classif_dropout"], inference=True),
        }

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """`(batch, num_labels)` from the first token."""
        k_pre, k_classifier = projection_keys(key, 2)
        pooled = jax.nn.relu(self.pre_classifier(hidden[:, 0], key=k_pre))
        out: Array = self.classifier(self.dropout(pooled, key=key), key=k_classifier)
        return out


@register_architecture
class DistilBertForTokenClassification(TokenClassification, _DistilBertHeads):
    """DistilBERT with a classifier on every token (`DistilBertForTokenClassification`):
    dropout (the config's `dropout`) and `classifier`; returns `(batch, seq, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.distilbert import DistilBertForTokenClassification
        >>> config = {"vocab_size": 50, "dim": 16, "n_layers": 1, "n_heads": 2, "hidden_dim": 32,
        ...           "num_labels": 4}
        >>> model = DistilBertForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 4)
    """

    architecture = "DistilBertForTokenClassification"
    dropout_key = "dropout"

    distilbert: DistilBertModel
