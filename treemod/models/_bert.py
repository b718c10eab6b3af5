"""BERT: `BertModel` and its heads (masked LM, sequence and token classification).

Each reads every `BertConfig` value `transformers`' class reads and refuses, by name, the ones
it does not compute (a decoder, cross-attention, relative position embeddings, an activation
with parameters). Models are built in inference mode (dropout off), as `transformers`'
`from_pretrained` returns them in `eval()` mode; `tm.nn.inference_mode(model, False)` switches
dropout on, and a call's `key=` then drives it. `BertModel` is also RoBERTa's and XLM-R's base:
they change its values, rules and default positions (`_roberta.py`); the heads are
`_bert_heads.py`'s one mechanism.
"""

# exports: BertModel, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn

from ._attention_parts import projection_keys, split_key
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert_heads import EncoderWithHead, TokenClassification, dropout_and_classifier
from ._bert_layers import (
    BertEmbeddings,
    BertEncoder,
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertPooler,
    BertPredictionHeadTransform,
    attention_bias,
    check_ids,
    check_positions,
    embed_inputs,
    make_encoder_layer,
    padded_positions,
)
from ._config_values import Value, read_config
from ._hf_activations import hf_activation

__all__ = [
    "BERT_VALUES",
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
    "encoder_inputs",
]

BERT_VALUES: dict[str, Value] = {
    "vocab_size": Value(30522, "size"),
    "hidden_size": Value(768, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "intermediate_size": Value(3072, "size"),
    "hidden_act": Value("gelu"),
    "hidden_dropout_prob": Value(0.1, "prob"),
    "attention_probs_dropout_prob": Value(0.1, "prob"),
    "max_position_embeddings": Value(512, "size"),
    "type_vocab_size": Value(2, "size"),
    "layer_norm_eps": Value(1e-12, "positive"),
    "pad_token_id": Value(0),
    "classifier_dropout": Value(None, "prob", nullable=True),
    "is_decoder": Value(False, "bool"),
    "add_cross_attention": Value(False, "bool"),
    "tie_word_embeddings": Value(True, "bool"),
    "position_embedding_type": Value("absolute"),
}
"""The values `BertConfig` holds for these classes, with its defaults."""


@register_architecture
class BertModel(PretrainedModel):
    """BERT's encoder (`transformers.BertModel`, with its pooler): returns `last_hidden_state`.

    Call it with `transformers`' input names: `input_ids` `(batch, seq)` (or `inputs_embeds`
    `(batch, seq, hidden)`), and optionally `attention_mask` (1 to attend, 0 for padding),
    `token_type_ids` and `position_ids`, as NumPy or JAX arrays.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import BertModel
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = BertModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), attention_mask=jnp.array([[1, 1, 0]])).shape
        (1, 3, 16)
        >>> model.encoder.layer.layers.attention.self.query.weight.shape   # 2 stacked layers
        (2, 16, 16)
    """

    architecture = "BertModel"
    model_type = "bert"
    base_model_prefix = "bert"
    config_values: ClassVar[Mapping[str, Value]] = BERT_VALUES
    # transformers skips the `position_ids` buffer older files saved (its model has the buffer).
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ("position_ids",)

    embeddings: BertEmbeddings
    encoder: BertEncoder
    pooler: BertPooler | None

    @classmethod
    def read(cls, owner: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """The config values this family reads, checked; refused ones raise `CheckpointError`."""
        c = read_config(owner, config, cls.config_values)
        hf_activation(owner, "hidden_act", c["hidden_act"])
        for key in ("is_decoder", "add_cross_attention"):
            if c[key]:
                raise config_error(owner, key, True, "false: a bidirectional encoder")
        position = c["position_embedding_type"]
        if position != "absolute":
            # transformers 5 reads no such key and computes absolute positions; a checkpoint
            # trained with relative positions would silently give other numbers.
            raise config_error(owner, "position_embedding_type", position, "'absolute'")
        if c["hidden_size"] % c["num_attention_heads"]:
            raise config_error(
                owner,
                "num_attention_heads",
                c["num_attention_heads"],
                f"a divisor of hidden_size={c['hidden_size']}",
            )
        cls.variant_rules(owner, c)
        return c

    @classmethod
    def variant_rules(cls, owner: str, c: dict[str, Any]) -> None:
        """BERT's padding id: null, or a token id."""
        pad = c["pad_token_id"]
        if pad is not None and not (
            isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < c["vocab_size"]
        ):
            raise config_error(owner, "pad_token_id", pad, "null or a token id below vocab_size")

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
        k_word, k_pos, k_type, k_layers, k_pool = jax.random.split(key, 5)
        pad = c["pad_token_id"]

        def embedding(n: int, k: PRNGKeyArray, padded: bool) -> nn.Embedding:
            table = nn.Embedding(n, hidden, dtype=dtype, key=k)
            if padded and pad is not None:  # PyTorch's padding_idx: that row starts at zero
                table = nn.Embedding(weight=table.weight.at[pad].set(0))
            return table

        embeddings = BertEmbeddings(
            word_embeddings=embedding(c["vocab_size"], k_word, True),
            position_embeddings=embedding(
                c["max_position_embeddings"], k_pos, cls.position_padding_idx(c) is not None
            ),
            token_type_embeddings=embedding(c["type_vocab_size"], k_type, False),
            LayerNorm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
            dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
        )

        def make_layer(k: PRNGKeyArray) -> Any:
            return make_encoder_layer(
                hidden,
                c["num_attention_heads"],
                c["intermediate_size"],
                c["hidden_act"],
                c["layer_norm_eps"],
                c["hidden_dropout_prob"],
                c["attention_probs_dropout_prob"],
                dtype,
                k,
            )

        encoder = BertEncoder(layer=nn.Stack(make_layer, c["num_hidden_layers"], key=k_layers))
        pool = None
        if pooler:
            pool = BertPooler(dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_pool))
        return cls(config=config, embeddings=embeddings, encoder=encoder, pooler=pool)

    @classmethod
    def position_padding_idx(cls, config: Mapping[str, Any]) -> int | None:
        """The padding position of the default positions (RoBERTa's); `None`: `0..seq-1`."""
        return None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
        add_pooling_layer: bool = True,
    ) -> Self:
        """Build the model with random weights from its config dict.

        Arguments:
            config: the config; keys it lacks take the config class's defaults.
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
        token_type_ids: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last layer's hidden states `(batch, seq, hidden)` (`last_hidden_state`); the
        model's call (the heads call it on their body).

        Arguments:
            input_ids: token ids `(batch, seq)`; or give `inputs_embeds` instead.
            attention_mask: `(batch, seq)`, 1 for tokens to attend to, 0 for padding.
            token_type_ids: segment ids `(batch, seq)` (default zeros).
            position_ids: positions `(batch, seq)` or `(1, seq)` (default `0..seq-1`; RoBERTa:
                counted over the non-padding tokens from `pad_token_id + 1`).
            inputs_embeds: word embeddings `(batch, seq, hidden)` instead of `input_ids`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, hidden)`.
        """
        name = type(self).__name__
        k_emb, k_enc = split_key(key, 2)
        pad = type(self).position_padding_idx(self.config)
        words, shape, positions = encoder_inputs(self, input_ids, inputs_embeds, position_ids, pad)
        token_type_ids = check_ids(name, "token_type_ids", token_type_ids, shape)
        if token_type_ids is None:
            token_type_ids = jnp.zeros(shape, jnp.int32)
        x = self.embeddings(words, token_type_ids, positions, key=k_emb)
        bias = attention_bias(attention_mask, shape, x.dtype)
        return self.encoder(x, bias, key=k_enc)

    # The call is `hidden_states` itself (one definition, the heads call it by that name).
    __call__ = hidden_states


def encoder_inputs(
    model: Any, input_ids: Any, inputs_embeds: Any, position_ids: Any, pad: int | None
) -> tuple[Array, tuple[int, int], Array]:
    """What BERT, DistilBERT, MPNet and RoBERTa do first with their inputs.

    Arguments:
        model: the encoder; `model.embeddings` holds `word_embeddings` and
            `position_embeddings`.
        input_ids: token ids `(batch, seq)`, or `None` with `inputs_embeds`.
        inputs_embeds: word embeddings `(batch, seq, hidden)`, or `None`.
        position_ids: `None`, or positions `(batch, seq)` / `(1, seq)` (checked).
        pad: `None` for the default positions `0..seq-1`; else the padding index from which
            real tokens count (RoBERTa's and MPNet's `create_position_ids_from_input_ids`).

    Returns:
        `(words, (batch, seq), positions)`: the word embeddings and the positions.
    """
    name = type(model).__name__
    emb = model.embeddings
    words, ids = embed_inputs(name, input_ids, inputs_embeds, emb.word_embeddings)
    shape = (words.shape[0], words.shape[1])
    positions = check_ids(name, "position_ids", position_ids, None)
    if positions is None:
        limit = emb.position_embeddings.weight.shape[0]
        check_positions(name, shape[1], shape[1] - 1 if pad is None else shape[1] + pad, limit)
        if pad is None:
            positions = jax.lax.iota(jnp.int32, shape[1])[None, :]  # jax2onnx: not jnp.arange
        else:
            positions = padded_positions(ids, shape, pad)
    return words, shape, positions


@register_architecture
class BertForMaskedLM(EncoderWithHead):
    """BERT with its masked-LM head (`transformers.BertForMaskedLM`): returns `logits`.

    With `tie_word_embeddings` (the default) the head's projection is the word embeddings'
    array, used in both places, plus the head's own bias (`cls.predictions.bias`); the tied
    names are listed by `tied_weights()`. Called as `BertModel` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import BertForMaskedLM
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32}
        >>> model = BertForMaskedLM.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 50)
        >>> model.tied_weights()["cls.predictions.decoder.weight"]
        'bert.embeddings.word_embeddings.weight'
    """

    architecture = "BertForMaskedLM"
    model_type = "bert"
    base_model_prefix = "bert"
    body = BertModel

    bert: BertModel
    cls: BertOnlyMLMHead

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`cls.predictions`: transform, bias, and a decoder only when untied."""
        k_dense, k_dec = jax.random.split(key)
        hidden, vocab = c["hidden_size"], c["vocab_size"]
        transform = BertPredictionHeadTransform(
            dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_dense),
            LayerNorm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
            act=c["hidden_act"],
        )
        decoder = None
        if not c["tie_word_embeddings"]:
            decoder = nn.Linear(hidden, vocab, dtype=dtype, key=k_dec)
        bias = jnp.zeros(vocab, transform.dense.weight.dtype)
        head = BertLMPredictionHead(transform=transform, bias=bias, decoder=decoder)
        return {"cls": BertOnlyMLMHead(predictions=head)}

    def tied_weights(self) -> dict[str, str]:
        """`cls.predictions.decoder.{weight,bias}` share the word embeddings and the head's bias."""
        if self.cls.predictions.decoder is not None:
            return {}
        return {
            "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`."""
        return self.cls(hidden, self.bert.embeddings.word_embeddings.weight, key=key)


@register_architecture
class BertForSequenceClassification(EncoderWithHead):
    """BERT with a classifier on its pooled output (`transformers.BertForSequenceClassification`).

    The number of labels is `id2label`'s size (else `num_labels`, else 2), as `transformers`
    counts it; `problem_type` only chooses a loss, so it is not read. Returns `logits`
    `(batch, num_labels)`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import BertForSequenceClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32,
        ...           "id2label": {"0": "neg", "1": "neutral", "2": "pos"}}
        >>> model = BertForSequenceClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3)
    """

    architecture = "BertForSequenceClassification"
    model_type = "bert"
    base_model_prefix = "bert"
    body = BertModel
    pooler = True
    labels = True

    bert: BertModel
    dropout: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def head(cls, c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
        """`dropout` (`classifier_dropout`, else `hidden_dropout_prob`) and `classifier`."""
        return dropout_and_classifier(c, key, dtype)

    def logits(self, hidden: Array, *, key: PRNGKeyArray | None) -> Array:
        """`classifier(dropout(pooler(hidden)))`, `(batch, num_labels)`."""
        assert self.bert.pooler is not None
        k_pool, k_classifier = projection_keys(key, 2)
        pooled = self.bert.pooler(hidden, key=k_pool)
        out: Array = self.classifier(self.dropout(pooled, key=key), key=k_classifier)
        return out


@register_architecture
class BertForTokenClassification(TokenClassification):
    """BERT with a classifier on every token (`transformers.BertForTokenClassification`).

    Labels are counted as `BertForSequenceClassification` counts them; returns `logits`
    `(batch, seq, num_labels)`. Called as `BertModel` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.bert import BertForTokenClassification
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "intermediate_size": 32, "num_labels": 5}
        >>> model = BertForTokenClassification.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]])).shape
        (1, 3, 5)
    """

    architecture = "BertForTokenClassification"
    model_type = "bert"
    base_model_prefix = "bert"
    body = BertModel

    bert: BertModel
