"""RoBERTa: `BertModel` with RoBERTa's values, positions and heads.

What differs from BERT: `RobertaConfig`'s defaults (`vocab_size` 50265, `pad_token_id` 1, which
must be a token id: it is also the position embeddings' padding row); default positions counted
over the non-padding tokens from `pad_token_id + 1` (a padding token takes `pad_token_id`), as
`transformers`' `create_position_ids_from_input_ids`, so left- and right-padded rows give the
same numbers; the masked-LM head `lm_head` (dense, exact GELU, `layer_norm`, decoder tied to the
word embeddings and to `lm_head.bias`); the sequence classifier's `classifier` (dense, tanh,
`out_proj` on the first token) with no pooler. XLM-RoBERTa (`_xlm_roberta.py`) is this with other
names.
"""

# exports: RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification  # noqa: E501

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from jax import Array
from jaxtyping import PRNGKeyArray

from ._base import config_error, register_architecture
from ._bert import BERT_VALUES, BertModel
from ._bert_heads import EncoderWithHead, TokenClassification
from ._bert_layers import ClassificationHead, LMHead, make_classification_head, make_lm_head
from ._config_values import Value

__all__ = [
    "ROBERTA_VALUES",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
    "RobertaForTokenClassification",
    "RobertaModel",
]

ROBERTA_VALUES: dict[str, Value] = {
    **BERT_VALUES,
    "vocab_size": Value(50265, "size"),
    "pad_token_id": Value(1),
}
"""The values `RobertaConfig` holds for these classes, with its defaults."""


@register_architecture
class RobertaModel(BertModel):
    """RoBERTa's encoder (`transformers.RobertaModel`, with its pooler): `last_hidden_state`.

    Called as `BertModel` is; without `position_ids` the positions are counted over the tokens
    that are not `pad_token_id`, from `pad_token_id + 1` (sequential from there with
    `inputs_embeds`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.roberta import RobertaModel
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32,
        ...           "max_position_embeddings": 10}
        >>> model = RobertaModel.from_config(config, key=jax.random.key(0))
        >>> left = model(input_ids=jnp.array([[1, 5, 6]]), attention_mask=jnp.array([[0, 1, 1]]))
        >>> bool(jnp.allclose(left[:, 1:], model(input_ids=jnp.array([[5, 6]])), atol=1e-5))
        True
    """

    architecture = "RobertaModel"
    model_type = "roberta"
    base_model_prefix = "roberta"
    config_values: ClassVar[Mapping[str, Value]] = ROBERTA_VALUES

    @classmethod
    def variant_rules(cls, owner: str, c: dict[str, Any]) -> None:
        """`pad_token_id`: a token id and a position (it pads both embeddings)."""
        pad = c["pad_token_id"]
        limit = min(c["vocab_size"], c["max_position_embeddings"])
        if isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < limit:
            raise config_error(
                owner,
                "pad_token_id",
                pad,
                f"a token id below vocab_size and max_position_embeddings ({limit})",
            )

    @classmethod
    def position_padding_idx(cls, config: Mapping[str, Any]) -> int | None:
        """`pad_token_id`: real tokens count from the next position."""
        pad: int = config.get("pad_token_id", cls.config_values["pad_token_id"].default)
        return pad


class _RobertaHeads(EncoderWithHead):
    """RoBERTa's body under RoBERTa's name, for its heads."""

    model_type = "roberta"
    base_model_prefix = "roberta"
    body = RobertaModel


@register_architecture
class RobertaForMaskedLM(_RobertaHeads):
    """RoBERTa with its masked-LM head (`transformers.RobertaForMaskedLM`): `logits`.

    `lm_head` is dense, exact GELU, `layer_norm` and the projection; with
    `tie_word_embeddings` (the default) the projection is the word embeddings' array plus
    `lm_head.bias` (`lm_head.decoder.weight` and `.bias` in `tied_weights()`). Called as
    `RobertaModel` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.roberta import RobertaForMaskedLM
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = RobertaForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3, 50)
        >>> model.tied_weights()["lm_head.decoder.bias"]
        'lm_head.bias'
    """

    architecture = "RobertaForMaskedLM"

    roberta: RobertaModel
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
            "lm_head.decoder.weight": f"{self.base_model_prefix}.embeddings.word_embeddings.weight",
            "lm_head.decoder.bias": "lm_head.bias",
        }

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`."""
        return self.lm_head(hidden, self.base_model().embeddings.word_embeddings.weight, key=key)


@register_architecture
class RobertaForSequenceClassification(_RobertaHeads):
    """RoBERTa with its classification head (`transformers.RobertaForSequenceClassification`).

    No pooler: `classifier` takes the first token through dropout, `dense`, tanh, dropout and
    `out_proj` (dropout `classifier_dropout`, else `hidden_dropout_prob`). Labels are counted as
    `transformers` counts them; returns `logits` `(batch, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.roberta import RobertaForSequenceClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 3}
        >>> model = RobertaForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3)
    """

    architecture = "RobertaForSequenceClassification"
    labels = True

    roberta: RobertaModel
    classifier: ClassificationHead

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`classifier`: dense, dropout, out_proj."""
        p = c["classifier_dropout"]
        p = c["hidden_dropout_prob"] if p is None else p
        head = make_classification_head(c["hidden_size"], c["num_labels"], p, dtype, key)
        return {"classifier": head}

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """`(batch, num_labels)` from the first token."""
        return self.classifier(hidden, key=key)


@register_architecture
class RobertaForTokenClassification(TokenClassification, _RobertaHeads):
    """RoBERTa with a classifier on every token (`transformers.RobertaForTokenClassification`):
    dropout (`classifier_dropout`, else `hidden_dropout_prob`) and `classifier`; returns
    `logits` `(batch, seq, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.roberta import RobertaForTokenClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 4}
        >>> model = RobertaForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[0, 7, 2]])).shape
        (1, 3, 4)
    """

    architecture = "RobertaForTokenClassification"

    roberta: RobertaModel
