"""BERT's parts (embeddings, encoder layer, pooler, masked-LM head) and what ViT and ResNet share.

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

from ._attention_parts import attend, split_key
from ._hf_activations import get_activation

__all__ = [
    "BertEmbeddings",
    "BertEncoder",
    "BertLayer",
    "BertOnlyMLMHead",
    "BertPooler",
    "attend_encoder",
    "attention_bias",
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
        q, k, v = (
            p(x).reshape(b, s, self.num_heads, -1) for p in (self.query, self.key, self.value)
        )
        out = attend_encoder(q, k, v, bias, self.dropout, key=key)
        return out.reshape(b, s, -1)


class BertSelfOutput(Module):
    """A projection, dropout, and the residual added before a LayerNorm (post-norm)."""

    dense: nn.Linear
    LayerNorm: nn.LayerNorm  # noqa: N815
    dropout: nn.Dropout

    def __call__(self, x: Array, residual: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`LayerNorm(dropout(dense(x)) + residual)`."""
        return self.LayerNorm(self.dropout(self.dense(x), key=key) + residual)


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

    def __call__(self, x: Array) -> Array:
        """`act(dense(x))`."""
        return get_activation(self.act)(self.dense(x))


class BertLayer(Module):
    """One encoder layer: attention, then the feed-forward block, each post-normed."""

    attention: BertAttention
    intermediate: BertIntermediate
    output: BertSelfOutput

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2 = split_key(key, 2)
        h = self.attention(x, bias, key=k1)
        return self.output(self.intermediate(h), h, key=k2)


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

    def __call__(self, hidden: Array) -> Array:
        """`(batch, seq, hidden)` to `(batch, out)`."""
        return get_activation(self.act)(self.dense(hidden[:, 0]))


class BertPredictionHeadTransform(Module):
    """Dense, activation, LayerNorm."""

    dense: nn.Linear
    LayerNorm: nn.LayerNorm  # noqa: N815
    act: str = field(static=True)

    def __call__(self, x: Array) -> Array:
        """The transformed hidden states."""
        return self.LayerNorm(get_activation(self.act)(self.dense(x)))


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

    def __call__(self, x: Array, word_embeddings: Array) -> Array:
        """`(batch, seq, hidden)` to `(batch, seq, vocab)` logits."""
        h = self.transform(x)
        if self.decoder is not None:
            return self.decoder(h)
        y = h @ word_embeddings.T.astype(h.dtype)
        return y + jnp.expand_dims(self.bias.astype(h.dtype), tuple(range(y.ndim - 1)))


class BertOnlyMLMHead(Module):
    """`cls.predictions` in `transformers`' names."""

    predictions: BertLMPredictionHead

    def __call__(self, x: Array, word_embeddings: Array) -> Array:
        """The masked-LM logits."""
        return self.predictions(x, word_embeddings)


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
