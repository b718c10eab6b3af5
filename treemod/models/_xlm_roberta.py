"""XLM-RoBERTa: RoBERTa under `XLMRobertaConfig`'s names and defaults (`vocab_size` 30522).

`transformers`' XLM-RoBERTa classes are RoBERTa's, module for module; only the config class
(its `model_type`, `xlm-roberta`, and its default vocabulary) differs, so each class here names
its body and architecture over `_roberta.py`'s.
"""

# exports: XLMRobertaModel, XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from ._base import register_architecture
from ._config_values import Value
from ._roberta import (
    ROBERTA_VALUES,
    RobertaForMaskedLM,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
)

__all__ = [
    "XLMRobertaForMaskedLM",
    "XLMRobertaForSequenceClassification",
    "XLMRobertaForTokenClassification",
    "XLMRobertaModel",
]

XLM_ROBERTA_VALUES: dict[str, Value] = {**ROBERTA_VALUES, "vocab_size": Value(30522, "size")}
"""The values `XLMRobertaConfig` holds for these classes, with its defaults."""


@register_architecture
class XLMRobertaModel(RobertaModel):
    """XLM-RoBERTa's encoder (`transformers.XLMRobertaModel`); see `RobertaModel`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.xlm_roberta import XLMRobertaModel
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> XLMRobertaModel.from_config(config, key=jax.random.key(0))(
        ...     input_ids=jnp.array([[0, 5, 2]])).shape
        (1, 3, 16)
    """

    architecture = "XLMRobertaModel"
    model_type = "xlm-roberta"
    config_values: ClassVar[Mapping[str, Value]] = XLM_ROBERTA_VALUES


@register_architecture
class XLMRobertaForMaskedLM(RobertaForMaskedLM):
    """XLM-RoBERTa's masked LM (`transformers.XLMRobertaForMaskedLM`); see `RobertaForMaskedLM`."""

    architecture = "XLMRobertaForMaskedLM"
    model_type = "xlm-roberta"
    body = XLMRobertaModel


@register_architecture
class XLMRobertaForSequenceClassification(RobertaForSequenceClassification):
    """XLM-RoBERTa's sequence classifier; see `RobertaForSequenceClassification`."""

    architecture = "XLMRobertaForSequenceClassification"
    model_type = "xlm-roberta"
    body = XLMRobertaModel


@register_architecture
class XLMRobertaForTokenClassification(RobertaForTokenClassification):
    """XLM-RoBERTa's token classifier; see `RobertaForTokenClassification`."""

    architecture = "XLMRobertaForTokenClassification"
    model_type = "xlm-roberta"
    body = XLMRobertaModel
