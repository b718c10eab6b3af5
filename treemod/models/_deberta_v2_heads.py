"""DeBERTa-v2's heads: `DebertaV2ForMaskedLM` (legacy and new head),
`DebertaV2ForSequenceClassification`, `DebertaV2ForTokenClassification`."""

# exports: DebertaV2ForMaskedLM, DebertaV2ForSequenceClassification,
# DebertaV2ForTokenClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import projection_keys, split_key
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert_layers import (
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertPredictionHeadTransform,
    vocab_logits,
)
from ._config_values import num_labels
from ._deberta_v2 import IGNORED_KEYS, DebertaV2Model, build_deberta, layer_norm, read_deberta
from ._hf_activations import get_activation

__all__ = [
    "DebertaV2ForMaskedLM",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
]


@axis_names({"bias": ("vocab",)})
class DebertaV2LMPredictionHead(Module):
    """The non-legacy masked-LM head (`legacy: false`): dense, activation, LayerNorm, then the
    word embeddings' projection plus `bias`."""

    dense: nn.Linear
    LayerNorm: nn.LayerNorm  # noqa: N815
    bias: Array
    act: str = field(static=True)

    def __call__(
        self, x: Array, word_embeddings: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` to `(batch, seq, vocab)` logits (`key`: `dense`'s)."""
        h = self.LayerNorm(get_activation(self.act)(self.dense(x, key=key)))
        return vocab_logits(h, None, self.bias, word_embeddings)


class DebertaV2OnlyMLMHead(Module):
    """`lm_predictions` in `transformers`' names."""

    lm_head: DebertaV2LMPredictionHead


@register_architecture
class DebertaV2ForMaskedLM(PretrainedModel):
    """DeBERTa-v2 with its masked-LM head (`transformers.DebertaV2ForMaskedLM`): `logits`.

    With `legacy` (the default) the head is BERT's (`cls.predictions`, its decoder tied to the
    word embeddings with `tie_word_embeddings`); without, `lm_predictions.lm_head`. Called as
    `DebertaV2Model` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.deberta_v2 import DebertaV2ForMaskedLM
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = DebertaV2ForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 50)
    """

    architecture = "DebertaV2ForMaskedLM"
    model_type = "deberta-v2"
    base_model_prefix = "deberta"
    keys_to_ignore_on_load_unexpected = (r"mask_predictions.*",)

    deberta: DebertaV2Model
    cls: BertOnlyMLMHead | None
    lm_predictions: DebertaV2OnlyMLMHead | None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `DebertaV2Model.from_config`)."""
        config = PretrainedConfig(config)
        c = read_deberta(cls.__name__, config)
        if not c["legacy"] and c["embedding_size"] != c["hidden_size"]:
            # transformers' non-legacy head multiplies hidden states by the word embeddings.
            raise config_error(
                cls.__name__, "embedding_size", c["embedding_size"], "hidden_size when not legacy"
            )
        k_model, k_dense, k_dec = jax.random.split(key, 3)
        deberta = DebertaV2Model(config, *build_deberta(c, k_model, dtype))
        hidden, emb, vocab = c["hidden_size"], c["embedding_size"], c["vocab_size"]
        bias = jnp.zeros(vocab, deberta.embeddings.word_embeddings.weight.dtype)
        if not c["legacy"]:
            head = DebertaV2LMPredictionHead(
                dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_dense),
                LayerNorm=layer_norm(hidden, c, dtype),
                bias=bias,
                act=c["hidden_act"],
            )
            return cls(config, deberta, None, DebertaV2OnlyMLMHead(head))
        transform = BertPredictionHeadTransform(
            dense=nn.Linear(hidden, emb, dtype=dtype, key=k_dense),
            LayerNorm=layer_norm(emb, c, dtype),
            act=c["hidden_act"],
        )
        decoder = None
        if not c["tie_word_embeddings"]:
            decoder = nn.Linear(emb, vocab, dtype=dtype, key=k_dec)
        predictions = BertLMPredictionHead(transform=transform, bias=bias, decoder=decoder)
        # Positional: the field `cls` (transformers' name) cannot be passed by keyword.
        return cls(config, deberta, BertOnlyMLMHead(predictions=predictions), None)

    def tied_weights(self) -> dict[str, str]:
        """The legacy decoder's weight and bias share the word embeddings and the head's bias."""
        if self.cls is None or self.cls.predictions.decoder is not None:
            return {}
        return {
            "cls.predictions.decoder.weight": "deberta.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }

    def __call__(self, **inputs: Any) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`; arguments as `DebertaV2Model`'s."""
        hidden = self.deberta(**inputs)
        (k_head,) = projection_keys(inputs.get("key"), 1)
        word = self.deberta.embeddings.word_embeddings.weight
        if self.cls is not None:
            return self.cls(hidden, word, key=k_head)
        assert self.lm_predictions is not None
        return self.lm_predictions.lm_head(hidden, word, key=k_head)


def _labels(name: str, config: PretrainedConfig) -> int:
    labels = num_labels(name, config)
    if labels < 1:
        raise config_error(name, "num_labels", labels, "at least 1 label")
    return labels


class ContextPooler(Module):
    """The first token through dropout, `dense` and `pooler_hidden_act`."""

    dense: nn.Linear
    dropout: nn.Dropout
    act: str = field(static=True)

    def __call__(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to `(batch, hidden)`."""
        (k_dense,) = projection_keys(key, 1)
        h = self.dense(self.dropout(hidden[:, 0], key=key), key=k_dense)
        return get_activation(self.act)(h)


@register_architecture
class DebertaV2ForSequenceClassification(PretrainedModel):
    """DeBERTa-v2 with a classifier on its pooled first token
    (`transformers.DebertaV2ForSequenceClassification`): `logits` `(batch, num_labels)`.

    The dropout before the classifier is `cls_dropout`, else `hidden_dropout_prob`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.deberta_v2 import DebertaV2ForSequenceClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 3}
        >>> model = DebertaV2ForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3)
    """

    architecture = "DebertaV2ForSequenceClassification"
    model_type = "deberta-v2"
    base_model_prefix = "deberta"
    keys_to_ignore_on_load_unexpected = IGNORED_KEYS

    deberta: DebertaV2Model
    pooler: ContextPooler
    dropout: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `DebertaV2Model.from_config`)."""
        config = PretrainedConfig(config)
        c = read_deberta(cls.__name__, config)
        labels = _labels(cls.__name__, config)
        k_model, k_pool, k_cls = jax.random.split(key, 3)
        hidden = c["hidden_size"]
        pooler = ContextPooler(
            dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_pool),
            dropout=nn.Dropout(c["pooler_dropout"], inference=True),
            act=c["pooler_hidden_act"],
        )
        p = c["cls_dropout"]
        return cls(
            config=config,
            deberta=DebertaV2Model(config, *build_deberta(c, k_model, dtype)),
            pooler=pooler,
            dropout=nn.Dropout(c["hidden_dropout_prob"] if p is None else p, inference=True),
            classifier=nn.Linear(hidden, labels, dtype=dtype, key=k_cls),
        )

    def __call__(self, **inputs: Any) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `DebertaV2Model`'s."""
        key = inputs.pop("key", None)
        k_model, k_pool, k_drop = split_key(key, 3)
        (k_classifier,) = projection_keys(key, 1)
        pooled = self.pooler(self.deberta(**inputs, key=k_model), key=k_pool)
        return self.classifier(self.dropout(pooled, key=k_drop), key=k_classifier)


@register_architecture
class DebertaV2ForTokenClassification(PretrainedModel):
    """DeBERTa-v2 with a classifier per token (`transformers.DebertaV2ForTokenClassification`):
    `logits` `(batch, seq, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.deberta_v2 import DebertaV2ForTokenClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = DebertaV2ForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 2)
    """

    architecture = "DebertaV2ForTokenClassification"
    model_type = "deberta-v2"
    base_model_prefix = "deberta"
    keys_to_ignore_on_load_unexpected = IGNORED_KEYS

    deberta: DebertaV2Model
    dropout: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights (see `DebertaV2Model.from_config`)."""
        config = PretrainedConfig(config)
        c = read_deberta(cls.__name__, config)
        labels = _labels(cls.__name__, config)
        k_model, k_cls = jax.random.split(key)
        return cls(
            config=config,
            deberta=DebertaV2Model(config, *build_deberta(c, k_model, dtype)),
            dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
            classifier=nn.Linear(c["hidden_size"], labels, dtype=dtype, key=k_cls),
        )

    def __call__(self, **inputs: Any) -> Array:
        """The `logits` `(batch, seq, num_labels)`; arguments as `DebertaV2Model`'s."""
        key = inputs.pop("key", None)
        k_model, k_drop = split_key(key, 2)
        (k_classifier,) = projection_keys(key, 1)
        hidden = self.deberta(**inputs, key=k_model)
        return self.classifier(self.dropout(hidden, key=k_drop), key=k_classifier)
