"""The one mechanism of the encoder families' heads: a base model (its field named as
`transformers` names it) and a head on its last hidden states.

`EncoderWithHead` reads the config through its `body` class (`BertModel`, `RobertaModel`,
`DistilBertModel`, `MPNetModel`, each with `read`, `build` and `hidden_states`), builds the body
and the head (`head`, the subclass's fields), and runs them (`logits`). A family's head class
declares only its fields, its body class and what its head computes; `TokenClassification`,
the same head in every family, is complete.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Self, TypeVar

import jax
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn

from ._attention_parts import projection_keys, split_key
from ._base import PretrainedConfig, PretrainedModel, config_error
from ._config_values import num_labels

_M = TypeVar("_M", bound=PretrainedModel)

__all__ = ["EncoderWithHead", "TokenClassification", "construct", "dropout_and_classifier"]


def construct(cls: type[_M], values: Mapping[str, Any]) -> _M:
    """`cls` built from its fields by name (positionally: BERT's field `cls` is no keyword)."""
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    return cls(*(values[n] for n in names))


def dropout_and_classifier(
    c: dict[str, Any], key: PRNGKeyArray, dtype: Any, p: float | None = None
) -> dict[str, Any]:
    """BERT's and RoBERTa's classifier fields: `dropout` (`p`, by default `classifier_dropout`,
    else `hidden_dropout_prob`) and `classifier` (`hidden_size` to `num_labels`)."""
    if p is None:
        given = c.get("classifier_dropout")
        p = float(c["hidden_dropout_prob"] if given is None else given)
    return {
        "dropout": nn.Dropout(p, inference=True),
        "classifier": nn.Linear(c["hidden_size"], c["num_labels"], dtype=dtype, key=key),
    }


class EncoderWithHead(PretrainedModel):
    """An encoder (`body`, at the field `base_model_prefix`) with a head on its hidden states.

    Subclasses set `body`, `architecture`, `model_type`, `base_model_prefix`, declare the head's
    fields and implement `head` and `logits`; `pooler` keeps the body's pooler, `labels` reads
    the number of labels (`id2label`'s size, else `num_labels`, else 2) into `c["num_labels"]`.
    Called with the body's inputs by name; returns `logits`.
    """

    body: ClassVar[type[Any]]
    pooler: ClassVar[bool] = False
    labels: ClassVar[bool] = False
    # Every encoder family's embeddings hold a `position_ids` buffer that older files saved;
    # transformers skips such a tensor whenever its model has that buffer.
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ("position_ids",)

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from its `transformers` config dict.

        Arguments:
            config: the config; keys it lacks take the config class's defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        name = cls.__name__
        c = cls.body.read(name, config)
        if cls.labels:
            c["num_labels"] = count = num_labels(name, config)
            if count < 1:
                raise config_error(name, "num_labels", count, "at least 1 label")
        k_body, k_head = jax.random.split(key)
        values = cls.head(c, k_head, dtype)
        values[cls.base_model_prefix] = cls.body.build(config, c, k_body, dtype, cls.pooler)
        values["config"] = config
        return construct(cls, values)

    @classmethod
    @abc.abstractmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """The head's fields, with random weights, from the read config values `c`."""

    @abc.abstractmethod
    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """The head's output on the body's last hidden states `(batch, seq, hidden)`."""

    def base_model(self) -> Any:
        """The encoder (the field `base_model_prefix` names)."""
        return getattr(self, self.base_model_prefix)

    def __call__(self, *, key: PRNGKeyArray | None = None, **inputs: Any) -> Array:
        """The head's `logits`; `inputs` are the base model's (`input_ids`, `attention_mask`,
        ...), `key` drives dropout after `tm.nn.inference_mode(model, False)`."""
        k_body, k_head = split_key(key, 2)
        hidden = self.base_model().hidden_states(key=k_body, **inputs)
        return self.logits(hidden, key=k_head)


class TokenClassification(EncoderWithHead):
    """Dropout and a linear classifier on every token: `logits` `(batch, seq, num_labels)`.

    The dropout's probability is `classifier_dropout`, else `hidden_dropout_prob` (BERT's and
    RoBERTa's rule); a family with another rule names its config key in `dropout_key`.
    """

    labels: ClassVar[bool] = True
    dropout_key: ClassVar[str | None] = None

    dropout: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`dropout` and `classifier` (`hidden_size` to `num_labels`)."""
        p = None if cls.dropout_key is None else float(c[cls.dropout_key])
        return dropout_and_classifier(c, key, dtype, p)

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """`classifier(dropout(hidden))`."""
        (k_classifier,) = projection_keys(key, 1)
        out: Array = self.classifier(self.dropout(hidden, key=key), key=k_classifier)
        return out
