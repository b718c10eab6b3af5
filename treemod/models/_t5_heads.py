"""T5's fine-tuning heads: `T5ForSequenceClassification`, `T5ForTokenClassification`.

Both hold their body under `transformer` (`transformers`' names: `transformer.shared.weight`,
`classification_head.dense.weight`, `classifier.weight`), so a `T5Model` or `T5EncoderModel`
checkpoint loads into them with its head reported missing. The number of labels is
`id2label`'s size (else `num_labels`, else 2), as `transformers` counts it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module
from treemod.models._attention_parts import projection_keys, split_key, token_inputs
from treemod.models._base import (
    PretrainedConfig,
    PretrainedModel,
    config_error,
    register_architecture,
)
from treemod.models._config_values import num_labels
from treemod.models._t5 import CROSS_BIAS, T5EncoderModel, T5Model, shift_right, t5_values

__all__ = ["T5ClassificationHead", "T5ForSequenceClassification", "T5ForTokenClassification"]


def _prefixed(tied: dict[str, str]) -> dict[str, str]:
    return {f"transformer.{a}": f"transformer.{s}" for a, s in tied.items()}


class T5ClassificationHead(Module):
    """`out_proj(dropout(tanh(dense(dropout(x)))))`."""

    dense: nn.Linear
    dropout: nn.Dropout
    out_proj: nn.Linear

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """Logits `(batch, num_labels)` of sentence representations `(batch, d_model)`."""
        k1, k2 = split_key(key, 2)
        k_dense, k_out = projection_keys(key, 2)
        x = jnp.tanh(self.dense(self.dropout(x, key=k1), key=k_dense))
        return self.out_proj(self.dropout(x, key=k2), key=k_out)


def _linear(n_in: int, n_out: int, std: float, dtype: Any, key: PRNGKeyArray) -> nn.Linear:
    init = nn.init.normal(std)
    return nn.Linear(n_in, n_out, True, dtype, weight_init=init, bias_init=nn.init.zeros, key=key)


@register_architecture
class T5ForSequenceClassification(PretrainedModel):
    """T5 with a classification head on the decoder's state at each row's last `eos_token_id`.

    Without `decoder_input_ids`, the decoder reads `input_ids` shifted right (as
    `transformers`). Every row must hold the same number of end-of-sequence tokens, at least
    one, as `transformers` requires (not checked inside a compiled function). Returns
    `(batch, num_labels)` logits.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5ForSequenceClassification
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 1,
        ...           "num_heads": 4, "decoder_start_token_id": 0, "num_labels": 3}
        >>> model = T5ForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[5, 6, 1], [7, 1, 0]])).shape
        (2, 3)
    """

    architecture: ClassVar[str] = "T5ForSequenceClassification"
    model_type: ClassVar[str] = "t5"
    base_model_prefix: ClassVar[str] = "transformer"
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = (CROSS_BIAS,)

    transformer: T5Model
    classification_head: T5ClassificationHead

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
        config = PretrainedConfig(config)
        owner = cls.__name__
        v = t5_values(owner, config)
        if isinstance(v["eos_token_id"], bool) or not isinstance(v["eos_token_id"], int):
            raise config_error(owner, "eos_token_id", v["eos_token_id"], "one token id (an int)")
        labels = num_labels(owner, config)
        dtype = jnp.float32 if dtype is None else dtype
        k_body, k_dense, k_out = jax.random.split(key, 3)
        d, std = v["d_model"], v["initializer_factor"] * v["d_model"] ** -0.5
        head = T5ClassificationHead(
            dense=_linear(d, d, std, dtype, k_dense),
            dropout=nn.Dropout(v["classifier_dropout"], inference=True),
            out_proj=_linear(d, labels, std, dtype, k_out),
        )
        body = T5Model.from_config(config, key=k_body, dtype=dtype)
        return cls(config=config, transformer=body, classification_head=head)

    def tied_weights(self) -> dict[str, str]:
        """The body's embedding aliases, under `transformer.`."""
        return _prefixed(self.transformer.tied_weights())

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        decoder_input_ids: Any = None,
        decoder_attention_mask: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The logits `(batch, num_labels)`.

        Arguments:
            input_ids: `(batch, src)` token ids, each row with its end-of-sequence token(s).
            attention_mask: `(batch, src)`, 1 for tokens and 0 for padding.
            decoder_input_ids: `(batch, tgt)`; default `input_ids` shifted right.
            decoder_attention_mask: `(batch, tgt)`.
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        owner = type(self).__name__
        ids, _, _ = token_inputs(owner, input_ids, None, None)
        v = t5_values(owner, self.config)
        if decoder_input_ids is None:
            decoder_input_ids = shift_right(owner, ids, v)
        k_body, k_head = split_key(key, 2)
        hidden = self.transformer(
            input_ids=ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            key=k_body,
        )
        if hidden.shape[1] != ids.shape[1]:
            raise ValueError(
                f"{owner}: the sentence is read at input_ids' end-of-sequence positions, so "
                f"decoder_input_ids must be as long as input_ids ({ids.shape[1]}); got "
                f"{hidden.shape[1]}."
            )
        eos = ids == v["eos_token_id"]
        last = ids.shape[1] - 1 - jnp.argmax(eos[:, ::-1], axis=1)
        sentence = jnp.take_along_axis(hidden, last[:, None, None], axis=1)[:, 0]
        return self.classification_head(sentence, key=k_head)


@register_architecture
class T5ForTokenClassification(PretrainedModel):
    """T5's encoder with a linear classifier per token: `(batch, seq, num_labels)` logits.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.t5 import T5ForTokenClassification
        >>> config = {"vocab_size": 50, "d_model": 16, "d_kv": 4, "d_ff": 32, "num_layers": 1,
        ...           "num_heads": 4, "num_labels": 5}
        >>> model = T5ForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[5, 6, 1]])).shape
        (1, 3, 5)
    """

    architecture: ClassVar[str] = "T5ForTokenClassification"
    model_type: ClassVar[str] = "t5"
    base_model_prefix: ClassVar[str] = "transformer"

    transformer: T5EncoderModel
    dropout: nn.Dropout
    classifier: nn.Linear

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
        config = PretrainedConfig(config)
        v = t5_values(cls.__name__, config)
        labels = num_labels(cls.__name__, config)
        dtype = jnp.float32 if dtype is None else dtype
        k_body, k_head = jax.random.split(key)
        std = v["initializer_factor"]
        return cls(
            config=config,
            transformer=T5EncoderModel.from_config(config, key=k_body, dtype=dtype),
            dropout=nn.Dropout(v["classifier_dropout"], inference=True),
            classifier=_linear(v["d_model"], labels, std, dtype, k_head),
        )

    def tied_weights(self) -> dict[str, str]:
        """The encoder's embedding alias, under `transformer.`."""
        return _prefixed(self.transformer.tied_weights())

    def __call__(
        self, *, input_ids: Any, attention_mask: Any = None, key: PRNGKeyArray | None = None
    ) -> Array:
        """The logits `(batch, seq, num_labels)`.

        Arguments:
            input_ids: `(batch, seq)` token ids.
            attention_mask: `(batch, seq)`, 1 for tokens and 0 for padding.
            key: PRNG key for dropout (training mode only).

        Returns:
            `logits`.
        """
        k_body, k_drop = split_key(key, 2)
        (k_classifier,) = projection_keys(key, 1)
        hidden = self.transformer(input_ids=input_ids, attention_mask=attention_mask, key=k_body)
        return self.classifier(self.dropout(hidden, key=k_drop), key=k_classifier)
