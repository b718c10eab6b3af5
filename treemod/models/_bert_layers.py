"""BERT's parts (embeddings, encoder layer, pooler, masked-LM heads) and what its variants share.

RoBERTa and XLM-RoBERTa reuse the whole encoder; RoBERTa and MPNet `LMHead` (their `lm_head`)
and `ClassificationHead` (their sequence classifier); DistilBERT and MPNet
`WordPositionEmbeddings`, `embed_inputs` and `attention_bias`; MPNet the feed-forward blocks;
ViT and ResNet the layers.

Attribute names are `transformers`' module names (`attention.self.query`, `LayerNorm`, ...), so
`tm.state_dict` names each array as `transformers`' `state_dict()` does. The encoder's layers are
one `nn.Stack` at `encoder.layer`. Attention is `attend_encoder`, the zoo's one attention
(`_attention_parts.attend`) with an additive bias and BERT's score precision.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import attend, projection_keys, split_key
from ._axis_layouts import attention_in, mlp_out, positions, vocab_head
from ._hf_activations import get_activation

__all__ = [
    "check_positions",
    "BertEmbeddings",
    "BertEncoder",
    "BertLayer",
    "BertOnlyMLMHead",
    "BertPooler",
    "ClassificationHead",
    "LMHead",
    "WordPositionEmbeddings",
    "attend_encoder",
    "attention_bias",
    "check_ids",
    "embed_inputs",
    "padded_positions",
    "vocab_logits",
]


def attend_encoder(
    q: Array,
    k: Array,
    v: Array,
    bias: Array | None,
    dropout: nn.Dropout | None = None,
    *,
    key: PRNGKeyArray | None = None,
) -> Array:
    """The encoders' (BERT's, ViT's) attention: `attend` scaled by `head_dim ** -0.5`, with an
    additive `bias`, the scores in the inputs' dtype (float32 at least for the softmax)."""
    scale = q.shape[-1] ** -0.5
    return attend(q, k, v, None, scale=scale, bias=bias, dropout=dropout, key=key, scores="input")


def attention_bias(attention_mask: Any, shape: tuple[int, int], dtype: Any) -> Array | None:
    """The additive bias `(batch, 1, 1, keys)` of a `(batch, keys)` mask of 1 (attend) and 0.

    Arguments:
        attention_mask: `None` (attend to every key) or a `(batch, keys)` array of 0 and 1.
        shape: the expected `(batch, keys)`.
        dtype: the scores' dtype.

    Returns:
        `None`, or 0 where the mask is 1 and the dtype's lowest value where it is 0 (so a row
        whose keys are all masked attends uniformly, as `transformers`' eager attention does).
    """
    if attention_mask is None:
        return None
    mask = jnp.asarray(attention_mask)
    if mask.shape != shape:
        raise ValueError(
            f"attention_mask has shape {mask.shape}; expected (batch, sequence) = {shape}, "
            "with 1 for the tokens to attend to and 0 for padding."
        )
    low = jnp.finfo(dtype).min
    return jnp.where(mask.astype(bool), jnp.zeros((), dtype), low)[:, None, None, :].astype(dtype)


def check_ids(owner: str, name: str, x: Any, shape: tuple[int, ...] | None) -> Array | None:
    """`x` as a `(batch, sequence)` array (of `shape` when given), or `None`."""
    if x is None:
        return None
    x = jnp.asarray(x)
    if x.ndim != 2 or (shape is not None and x.shape != shape):
        want = "(batch, sequence)" if shape is None else f"{shape}, the shape of input_ids"
        raise ValueError(f"{owner}: {name} has shape {x.shape}; expected {want}.")
    checked: Array = x
    return checked


def embed_inputs(
    owner: str, input_ids: Any, inputs_embeds: Any, word_embeddings: nn.Embedding
) -> tuple[Array, Array | None]:
    """The word embeddings `(batch, seq, hidden)` of exactly one of `input_ids` and
    `inputs_embeds`, and the checked `input_ids` (`None` when embeddings were given)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"{owner}: give exactly one of input_ids and inputs_embeds.")
    if input_ids is not None:
        ids = check_ids(owner, "input_ids", input_ids, None)
        assert ids is not None
        if not jnp.issubdtype(ids.dtype, jnp.integer):
            raise TypeError(f"{owner}: input_ids must be integers; got dtype {ids.dtype}.")
        return word_embeddings(ids), ids
    words = jnp.asarray(inputs_embeds)
    if words.ndim != 3:
        raise ValueError(
            f"{owner}: inputs_embeds has shape {words.shape}; expected (batch, sequence, "
            "hidden_size)."
        )
    return words, None


def check_positions(owner: str, seq: Any, last: Any, limit: int) -> None:
    """Refuse a sequence of `seq` tokens whose last position `last` is past the position table
    of `limit` rows (an embedding lookup would clamp it silently). Under `jax.export` with a
    symbolic length, the length must be bounded by a constraint.

    Arguments:
        owner: the model class, for messages.
        seq: the sequence length (an int, or a symbolic dimension).
        last: the last position id it needs.
        limit: the position table's rows (`max_position_embeddings`).
    """
    try:
        past = bool(last >= limit)
    except Exception:  # jax.export's symbolic length without a bound: inconclusive
        bound = limit - 1 - (last - seq)
        raise ValueError(
            f"{owner}: the symbolic sequence length {seq} is not bounded, and position {last} "
            f"must stay below max_position_embeddings={limit}: export with a constraint, e.g. "
            f"jax.export.symbolic_shape('batch, {seq}', constraints=['{seq} <= {bound}'])."
        ) from None
    if past:
        raise ValueError(
            f"{owner}: a sequence of {seq} tokens needs position {last}; max_position_embeddings "
            f"is {limit}."
        )


def padded_positions(ids: Array | None, shape: tuple[int, int], padding_idx: int) -> Array:
    """RoBERTa's and MPNet's default positions (`create_position_ids_from_input_ids`).

    Real tokens (not `padding_idx`) count from `padding_idx + 1`; padding tokens take
    `padding_idx`, so a left-padded row's first token is at `padding_idx + 1` as in an unpadded
    one. Without ids (`inputs_embeds`) every token is real: `padding_idx + 1 ...`.
    """
    if ids is None:
        return jnp.broadcast_to(jnp.arange(shape[1]) + padding_idx + 1, shape)
    real = (ids != padding_idx).astype(jnp.int32)
    return jnp.cumsum(real, axis=1) * real + padding_idx


@axis_names(positions("position_embeddings", "token_type_embeddings"))
class BertEmbeddings(Module):
    """Word, position and token-type embeddings, summed, normalised (`transformers`' names)."""

    word_embeddings: nn.Embedding
    position_embeddings: nn.Embedding
    token_type_embeddings: nn.Embedding
    LayerNorm: nn.LayerNorm  # noqa: N815 (transformers' name)
    dropout: nn.Dropout

    def __call__(
        self,
        words: Array,
        token_type_ids: Array,
        position_ids: Array,
        *,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """Looked-up word embeddings `(batch, seq, hidden)` plus token types and positions."""
        x = words + self.token_type_embeddings(token_type_ids)
        x = x + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x), key=key)


@axis_names(positions("position_embeddings"))
class WordPositionEmbeddings(Module):
    """Word plus position embeddings, normalised: DistilBERT's and MPNet's `embeddings`."""

    word_embeddings: nn.Embedding
    position_embeddings: nn.Embedding
    LayerNorm: nn.LayerNorm  # noqa: N815 (transformers' name)
    dropout: nn.Dropout

    def __call__(
        self, words: Array, position_ids: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` word embeddings plus positions."""
        x = words + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(x), key=key)


@axis_names(attention_in("query", "key", "value"))
class BertSelfAttention(Module):
    """The query, key and value projections and the attention itself."""

    query: nn.Linear
    key: nn.Linear
    value: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the heads' concatenated outputs."""
        b, s, _ = x.shape
        keys = projection_keys(key, 3)
        q, k, v = (
            p(x, key=pk).reshape(b, s, self.num_heads, -1)
            for p, pk in zip((self.query, self.key, self.value), keys, strict=True)
        )
        out = attend_encoder(q, k, v, bias, self.dropout, key=key)
        return out.reshape(b, s, -1)


@axis_names(mlp_out("dense"))
class BertSelfOutput(Module):
    """A projection, dropout, and the residual added before a LayerNorm (post-norm)."""

    dense: nn.Linear
    LayerNorm: nn.LayerNorm  # noqa: N815
    dropout: nn.Dropout

    def __call__(self, x: Array, residual: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`LayerNorm(dropout(dense(x)) + residual)`."""
        (k_dense,) = projection_keys(key, 1)
        return self.LayerNorm(self.dropout(self.dense(x, key=k_dense), key=key) + residual)


@axis_names({"output.dense.weight": ("embed", "heads")})
class BertAttention(Module):
    """Self-attention (`attention.self` in `transformers`) and its output block."""

    self: BertSelfAttention
    output: BertSelfOutput

    def __call__(
        this, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None
    ) -> Array:  # `this`: the field `self` is transformers' name
        """The attention block's output `(batch, seq, hidden)`."""
        k1, k2 = split_key(key, 2)
        return this.output(this.self(x, bias, key=k1), x, key=k2)


class BertIntermediate(Module):
    """The feed-forward block's first projection and activation."""

    dense: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`act(dense(x))` (`key`: `dense`'s, for LoRA dropout)."""
        return get_activation(self.act)(self.dense(x, key=key))


class BertLayer(Module):
    """One encoder layer: attention, then the feed-forward block, each post-normed."""

    attention: BertAttention
    intermediate: BertIntermediate
    output: BertSelfOutput

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        (k_inner,) = projection_keys(key, 1)
        h = self.attention(x, bias, key=k1)
        return self.output(self.intermediate(h, key=k_inner), h, key=k2)


class BertEncoder(Module):
    """The encoder layers, one `nn.Stack` (`encoder.layer.{i}` in `transformers`' names)."""

    layer: nn.Stack

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """Run every layer."""
        out: Array = self.layer(x, bias, key=key)
        return out


class BertPooler(Module):
    """The first token's hidden state through a dense layer and an activation."""

    dense: nn.Linear
    act: str = field(static=True, default="tanh")

    def __call__(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to `(batch, out)` (`key`: `dense`'s, for LoRA dropout)."""
        return get_activation(self.act)(self.dense(hidden[:, 0], key=key))


class BertPredictionHeadTransform(Module):
    """Dense, activation, LayerNorm."""

    dense: nn.Linear
    LayerNorm: nn.LayerNorm  # noqa: N815
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The transformed hidden states (`key`: `dense`'s, for LoRA dropout)."""
        return self.LayerNorm(get_activation(self.act)(self.dense(x, key=key)))


@axis_names({"bias": ("vocab",), **vocab_head("decoder")})
class BertLMPredictionHead(Module):
    """The masked-LM head: a transform, then a projection onto the vocabulary.

    With tied embeddings `decoder` is `None` and the projection uses the word embeddings' array
    and `bias` (`transformers` ties `cls.predictions.decoder.weight` and `.bias` to them).
    Untied, `decoder` holds its own weight and bias, and `bias` is kept only because
    `transformers` keeps it (unused) in the state dict.
    """

    transform: BertPredictionHeadTransform
    bias: Array
    decoder: nn.Linear | None

    def __call__(
        self, x: Array, word_embeddings: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` to `(batch, seq, vocab)` logits (`key`: the projections')."""
        k_transform, k_decoder = projection_keys(key, 2)
        h = self.transform(x, key=k_transform)
        return vocab_logits(h, self.decoder, self.bias, word_embeddings, key=k_decoder)


def vocab_logits(
    h: Array,
    decoder: Any,
    bias: Array,
    word_embeddings: Array,
    *,
    key: PRNGKeyArray | None = None,
) -> Array:
    """The masked-LM heads' last projection: `decoder(h, key=key)` when untied, else
    `h @ word_embeddings.T + bias` (`transformers` ties the decoder's weight and bias to those
    arrays)."""
    if decoder is not None:
        out: Array = decoder(h, key=key)
        return out
    y = h @ word_embeddings.T.astype(h.dtype)
    return y + jnp.expand_dims(bias.astype(h.dtype), tuple(range(y.ndim - 1)))


class BertOnlyMLMHead(Module):
    """`cls.predictions` in `transformers`' names."""

    predictions: BertLMPredictionHead

    def __call__(
        self, x: Array, word_embeddings: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """The masked-LM logits (`key`: the projections', for LoRA dropout)."""
        return self.predictions(x, word_embeddings, key=key)


@axis_names({"bias": ("vocab",), **vocab_head("decoder")})
class LMHead(Module):
    """RoBERTa's and MPNet's `lm_head`: dense, exact GELU (whatever `hidden_act` is), layer_norm,
    then the projection onto the vocabulary (tied as `BertLMPredictionHead`'s: `decoder` is
    `None` and `bias` the tied bias, or `decoder` holds its own weight and bias)."""

    dense: nn.Linear
    layer_norm: nn.LayerNorm
    bias: Array
    decoder: nn.Linear | None

    def __call__(
        self, x: Array, word_embeddings: Array, *, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, seq, hidden)` to `(batch, seq, vocab)` logits (`key`: the projections')."""
        k_dense, k_decoder = projection_keys(key, 2)
        h = self.layer_norm(get_activation("gelu")(self.dense(x, key=k_dense)))
        return vocab_logits(h, self.decoder, self.bias, word_embeddings, key=k_decoder)


class ClassificationHead(Module):
    """RoBERTa's and MPNet's sequence classifier: the first token through dropout, dense, tanh,
    dropout and `out_proj`."""

    dense: nn.Linear
    dropout: nn.Dropout
    out_proj: nn.Linear

    def __call__(self, hidden: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to `(batch, num_labels)`."""
        k1, k2 = split_key(key, 2)
        k_dense, k_out = projection_keys(key, 2)
        x = jnp.tanh(self.dense(self.dropout(hidden[:, 0], key=k1), key=k_dense))
        out: Array = self.out_proj(self.dropout(x, key=k2), key=k_out)
        return out


def make_lm_head(
    hidden: int, vocab: int, eps: float, tied: bool, dtype: Any, key: PRNGKeyArray
) -> LMHead:
    """An `LMHead` with random weights and a zero bias (`decoder` only when untied)."""
    k_dense, k_dec = jax.random.split(key)
    dense = nn.Linear(hidden, hidden, dtype=dtype, key=k_dense)
    decoder = None if tied else nn.Linear(hidden, vocab, dtype=dtype, key=k_dec)
    bias = jnp.zeros(vocab, dense.weight.dtype)
    return LMHead(dense, nn.LayerNorm(hidden, eps=eps, dtype=dtype), bias, decoder)


def make_classification_head(
    hidden: int, labels: int, p: float, dtype: Any, key: PRNGKeyArray
) -> ClassificationHead:
    """A `ClassificationHead` with random weights and dropout probability `p`."""
    k_dense, k_out = jax.random.split(key)
    return ClassificationHead(
        dense=nn.Linear(hidden, hidden, dtype=dtype, key=k_dense),
        dropout=nn.Dropout(p, inference=True),
        out_proj=nn.Linear(hidden, labels, dtype=dtype, key=k_out),
    )


def make_encoder_layer(
    hidden: int,
    heads: int,
    intermediate: int,
    act: str,
    eps: float,
    hidden_dropout: float,
    attention_dropout: float,
    dtype: Any,
    key: PRNGKeyArray,
) -> BertLayer:
    """One `BertLayer` with random weights."""
    ks = jax.random.split(key, 6)
    self_attention = BertSelfAttention(
        query=nn.Linear(hidden, hidden, dtype=dtype, key=ks[0]),
        key=nn.Linear(hidden, hidden, dtype=dtype, key=ks[1]),
        value=nn.Linear(hidden, hidden, dtype=dtype, key=ks[2]),
        dropout=nn.Dropout(attention_dropout, inference=True),
        num_heads=heads,
    )

    def out_block(n_in: int, k: PRNGKeyArray) -> BertSelfOutput:
        return BertSelfOutput(
            dense=nn.Linear(n_in, hidden, dtype=dtype, key=k),
            LayerNorm=nn.LayerNorm(hidden, eps=eps, dtype=dtype),
            dropout=nn.Dropout(hidden_dropout, inference=True),
        )

    return BertLayer(
        attention=BertAttention(self_attention, out_block(hidden, ks[3])),
        intermediate=BertIntermediate(
            dense=nn.Linear(hidden, intermediate, dtype=dtype, key=ks[4]), act=act
        ),
        output=out_block(intermediate, ks[5]),
    )
