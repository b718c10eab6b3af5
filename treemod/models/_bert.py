"""BERT: `BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`.

Each reads every `BertConfig` value `transformers`' class reads and refuses, by name, the ones
it does not compute (a decoder, cross-attention, relative position embeddings, an activation
with parameters). Models are built in inference mode (dropout off), as `transformers`'
`from_pretrained` returns them in `eval()` mode; `tm.nn.inference_mode(model, False)` switches
dropout on, and a call's `key=` then drives it.
"""

# exports: BertModel, BertForMaskedLM, BertForSequenceClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn

from ._attention_parts import split_key
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert_layers import (
    BertEmbeddings,
    BertEncoder,
    BertLMPredictionHead,
    BertOnlyMLMHead,
    BertPooler,
    BertPredictionHeadTransform,
    attention_bias,
    make_encoder_layer,
)
from ._config_values import Value, num_labels, read_config
from ._hf_activations import hf_activation

__all__ = ["BertModel", "BertForMaskedLM", "BertForSequenceClassification"]

# The values these classes read, with `transformers.BertConfig`'s defaults.
_VALUES: dict[str, Value] = {
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


def _read(cls_name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values BERT reads, checked; refused values raise `CheckpointError`."""
    c = read_config(cls_name, config, _VALUES)
    hf_activation(cls_name, "hidden_act", c["hidden_act"])
    for key in ("is_decoder", "add_cross_attention"):
        if c[key]:
            raise config_error(cls_name, key, True, "false: BERT as a bidirectional encoder")
    position = c["position_embedding_type"]
    if position != "absolute":
        # transformers 5 reads no such key and computes absolute positions; a checkpoint trained
        # with relative positions would silently give other numbers.
        raise config_error(cls_name, "position_embedding_type", position, "'absolute'")
    if c["hidden_size"] % c["num_attention_heads"]:
        raise config_error(
            cls_name,
            "num_attention_heads",
            c["num_attention_heads"],
            f"a divisor of hidden_size={c['hidden_size']}",
        )
    pad = c["pad_token_id"]
    if pad is not None and not (
        isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < c["vocab_size"]
    ):
        raise config_error(cls_name, "pad_token_id", pad, "null or a token id below vocab_size")
    return c


def _check_ids(cls_name: str, name: str, x: Any, shape: tuple[int, ...] | None) -> Array | None:
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.ndim != 2 or (shape is not None and x.shape != shape):
        want = "(batch, sequence)" if shape is None else f"{shape}, the shape of input_ids"
        raise ValueError(f"{cls_name}: {name} has shape {x.shape}; expected {want}.")
    checked: Array = x
    return checked


def _build_bert(
    c: dict[str, Any], key: PRNGKeyArray, dtype: Any, pooler: bool
) -> tuple[BertEmbeddings, BertEncoder, BertPooler | None]:
    hidden = c["hidden_size"]
    k_word, k_pos, k_type, k_layers, k_pool = jax.random.split(key, 5)
    word = nn.Embedding(c["vocab_size"], hidden, dtype=dtype, key=k_word)
    if c["pad_token_id"] is not None:  # PyTorch's padding_idx: the padding row starts at zero
        word = nn.Embedding(weight=word.weight.at[c["pad_token_id"]].set(0))
    embeddings = BertEmbeddings(
        word_embeddings=word,
        position_embeddings=nn.Embedding(
            c["max_position_embeddings"], hidden, dtype=dtype, key=k_pos
        ),
        token_type_embeddings=nn.Embedding(c["type_vocab_size"], hidden, dtype=dtype, key=k_type),
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
    pool = BertPooler(dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_pool)) if pooler else None
    return embeddings, encoder, pool


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

    embeddings: BertEmbeddings
    encoder: BertEncoder
    pooler: BertPooler | None

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
        add_pooling_layer: bool = True,
    ) -> Self:
        """Build the model with random weights from a `BertConfig` dict.

        Arguments:
            config: the config; keys it lacks take `BertConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).
            add_pooling_layer: build the pooler (`transformers`' argument of the same name).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        embeddings, encoder, pooler = _build_bert(c, key, dtype, add_pooling_layer)
        return cls(config=config, embeddings=embeddings, encoder=encoder, pooler=pooler)

    def __call__(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The last layer's hidden states `(batch, seq, hidden)` (`last_hidden_state`).

        Arguments:
            input_ids: token ids `(batch, seq)`; or give `inputs_embeds` instead.
            attention_mask: `(batch, seq)`, 1 for tokens to attend to, 0 for padding.
            token_type_ids: segment ids `(batch, seq)` (default zeros).
            position_ids: positions `(batch, seq)` or `(1, seq)` (default `0..seq-1`).
            inputs_embeds: word embeddings `(batch, seq, hidden)` instead of `input_ids`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, hidden)`.
        """
        return self.hidden_states(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            key=key,
        )

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
        """`last_hidden_state`; the arguments are `__call__`'s."""
        name = type(self).__name__
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{name}: give exactly one of input_ids and inputs_embeds.")
        k_emb, k_enc = split_key(key, 2)
        emb = self.embeddings
        if input_ids is not None:
            ids = _check_ids(name, "input_ids", input_ids, None)
            assert ids is not None
            if not jnp.issubdtype(ids.dtype, jnp.integer):
                raise TypeError(f"{name}: input_ids must be integers; got dtype {ids.dtype}.")
            words = emb.word_embeddings(ids)
        else:
            words = jnp.asarray(inputs_embeds)
            if words.ndim != 3:
                raise ValueError(
                    f"{name}: inputs_embeds has shape {words.shape}; expected (batch, "
                    "sequence, hidden_size)."
                )
        shape = (words.shape[0], words.shape[1])
        token_type_ids = _check_ids(name, "token_type_ids", token_type_ids, shape)
        position_ids = _check_ids(name, "position_ids", position_ids, None)
        if position_ids is None:
            position_ids = jnp.arange(shape[1])[None, :]
        if token_type_ids is None:
            token_type_ids = jnp.zeros(shape, jnp.int32)
        x = emb(words, token_type_ids, position_ids, key=k_emb)
        bias = attention_bias(attention_mask, shape, x.dtype)
        return self.encoder(x, bias, key=k_enc)


@register_architecture
class BertForMaskedLM(PretrainedModel):
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

    bert: BertModel
    cls: BertOnlyMLMHead

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `BertConfig` dict (see `BertModel`)."""
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        k_bert, k_dense, k_dec = jax.random.split(key, 3)
        embeddings, encoder, _ = _build_bert(c, k_bert, dtype, pooler=False)
        bert = BertModel(config=config, embeddings=embeddings, encoder=encoder, pooler=None)
        hidden, vocab = c["hidden_size"], c["vocab_size"]
        transform = BertPredictionHeadTransform(
            dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_dense),
            LayerNorm=nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype),
            act=c["hidden_act"],
        )
        decoder = None
        if not c["tie_word_embeddings"]:
            decoder = nn.Linear(hidden, vocab, dtype=dtype, key=k_dec)
        bias = jnp.zeros(vocab, embeddings.word_embeddings.weight.dtype)
        head = BertLMPredictionHead(transform=transform, bias=bias, decoder=decoder)
        # Positional: the field `cls` (transformers' name) cannot be passed by keyword.
        return cls(config, bert, BertOnlyMLMHead(predictions=head))

    def tied_weights(self) -> dict[str, str]:
        """`cls.predictions.decoder.{weight,bias}` share the word embeddings and the head's bias."""
        if self.cls.predictions.decoder is not None:
            return {}
        return {
            "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias",
        }

    def __call__(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The masked-LM `logits` `(batch, seq, vocab_size)`; arguments as `BertModel`'s."""
        hidden = self.bert.hidden_states(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            key=key,
        )
        return self.cls(hidden, self.bert.embeddings.word_embeddings.weight)


@register_architecture
class BertForSequenceClassification(PretrainedModel):
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

    bert: BertModel
    dropout: nn.Dropout
    classifier: nn.Linear

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `BertConfig` dict (see `BertModel`)."""
        config = PretrainedConfig(config)
        name = cls.__name__
        c = _read(name, config)
        labels = num_labels(name, config)
        if labels < 1:
            raise config_error(name, "num_labels", labels, "at least 1 label")
        k_bert, k_cls = jax.random.split(key)
        embeddings, encoder, pooler = _build_bert(c, k_bert, dtype, pooler=True)
        bert = BertModel(config=config, embeddings=embeddings, encoder=encoder, pooler=pooler)
        p = c["classifier_dropout"]
        dropout = nn.Dropout(c["hidden_dropout_prob"] if p is None else p, inference=True)
        classifier = nn.Linear(c["hidden_size"], labels, dtype=dtype, key=k_cls)
        return cls(config=config, bert=bert, dropout=dropout, classifier=classifier)

    def __call__(
        self,
        *,
        input_ids: Any = None,
        attention_mask: Any = None,
        token_type_ids: Any = None,
        position_ids: Any = None,
        inputs_embeds: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `BertModel`'s."""
        k_bert, k_drop = split_key(key, 2)
        hidden = self.bert.hidden_states(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            key=k_bert,
        )
        assert self.bert.pooler is not None
        return self.classifier(self.dropout(self.bert.pooler(hidden), key=k_drop))
