"""DeBERTa-v2 (and v3): the config reader, the build, and `DebertaV2Model` (the heads:
`_deberta_v2_heads.py`).

Each reads every `DebertaV2Config` value `transformers`' classes read, the ones they read with
`getattr` included (`position_buckets`, `share_att_key`, `norm_rel_ebd`, `conv_kernel_size`,
`embedding_size`, ...), and refuses, by name, the ones it does not compute. Models are built in
inference mode (dropout off); `tm.nn.inference_mode(model, False)` switches dropout on, and a
call's `key=` then drives it.
"""

# exports: DebertaV2Model

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
    BertIntermediate,
    BertSelfOutput,
    check_ids,
    embed_inputs,
)
from ._config_values import Value, read_config
from ._deberta_v2_layers import (
    DebertaV2Attention,
    DebertaV2ConvLayer,
    DebertaV2Embeddings,
    DebertaV2Encoder,
    DebertaV2Layer,
    DisentangledSelfAttention,
)
from ._hf_activations import hf_activation

__all__ = ["DebertaV2Model", "IGNORED_KEYS", "build_deberta", "layer_norm", "read_deberta"]

# The values these classes read, with `transformers.DebertaV2Config`'s defaults (and those of
# the `getattr`s in its modeling file).
_VALUES: dict[str, Value] = {
    "vocab_size": Value(128100, "size"),
    "hidden_size": Value(1536, "size"),
    "num_hidden_layers": Value(24, "size"),
    "num_attention_heads": Value(24, "size"),
    "intermediate_size": Value(6144, "size"),
    "hidden_act": Value("gelu"),
    "hidden_dropout_prob": Value(0.1, "dropout"),
    "attention_probs_dropout_prob": Value(0.1, "dropout"),
    "max_position_embeddings": Value(512, "size"),
    "type_vocab_size": Value(0, "count"),
    "layer_norm_eps": Value(1e-7, "positive"),
    "relative_attention": Value(False, "bool"),
    "max_relative_positions": Value(-1),
    "position_buckets": Value(-1),
    "pad_token_id": Value(0),
    "position_biased_input": Value(True, "bool"),
    "pos_att_type": Value(None, nullable=True),
    "share_att_key": Value(False, "bool"),
    "norm_rel_ebd": Value("none"),
    "conv_kernel_size": Value(0, "count"),
    "conv_groups": Value(1, "size"),
    "conv_act": Value("tanh"),
    "embedding_size": Value(None, "size", nullable=True),
    "attention_head_size": Value(None, "size", nullable=True),
    "pooler_hidden_size": Value(None, "size", nullable=True),
    "pooler_dropout": Value(0.0, "dropout"),
    "pooler_hidden_act": Value("gelu"),
    "cls_dropout": Value(None, "dropout", nullable=True),
    "legacy": Value(True, "bool"),
    "tie_word_embeddings": Value(True, "bool"),
}


# transformers' `_keys_to_ignore_on_load_unexpected = ["position_embeddings"]`: the one tensor of
# that name, left in files of models without absolute positions (`position_biased_input: false`).
IGNORED_KEYS = (r"embeddings\.position_embeddings\.weight",)


def _integer(name: str, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise config_error(name, key, value, "an integer (<= 0 for none)")
    return value


def read_deberta(name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values DeBERTa-v2 reads, checked; refused values raise `CheckpointError`."""
    c = read_config(name, config, _VALUES)
    for key in ("hidden_act", "pooler_hidden_act", "conv_act"):
        hf_activation(name, key, c[key])
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    if hidden % heads:
        raise config_error(name, "num_attention_heads", heads, f"a divisor of hidden_size={hidden}")
    for key, want in (("attention_head_size", hidden // heads), ("pooler_hidden_size", hidden)):
        if c[key] not in (None, want):  # transformers' next layer expects hidden_size inputs
            raise config_error(name, key, c[key], f"null or {want}")
    types = c["pos_att_type"] or []
    if isinstance(types, str):
        types = [t.strip() for t in types.lower().split("|")]
    if not isinstance(types, list | tuple) or any(t not in ("c2p", "p2c") for t in types):
        raise config_error(
            name, "pos_att_type", c["pos_att_type"], "null or a list of 'c2p', 'p2c'"
        )
    c["pos_att_type"] = tuple(sorted(set(types)))
    norms = [t.strip() for t in str(c["norm_rel_ebd"]).lower().split("|")]
    if any(t not in ("none", "layer_norm") for t in norms):
        raise config_error(name, "norm_rel_ebd", c["norm_rel_ebd"], "'none', 'layer_norm'")
    c["norm_rel_ebd"] = "layer_norm" in norms
    for key in ("max_relative_positions", "position_buckets"):
        _integer(name, key, c[key])
    if c["max_relative_positions"] < 1:
        c["max_relative_positions"] = c["max_position_embeddings"]
    c["att_span"] = (
        c["position_buckets"] if c["position_buckets"] > 0 else c["max_relative_positions"]
    )
    if c["position_buckets"] > 0 and c["position_buckets"] < 2:
        raise config_error(name, "position_buckets", c["position_buckets"], "<= 0, or >= 2")
    kernel = c["conv_kernel_size"]
    if kernel and kernel % 2 == 0:  # transformers' padding (k - 1) // 2 shortens the sequence
        raise config_error(name, "conv_kernel_size", kernel, "0 (no convolution) or odd")
    if kernel and hidden % c["conv_groups"]:
        raise config_error(name, "conv_groups", c["conv_groups"], f"a divisor of {hidden}")
    c["embedding_size"] = c["embedding_size"] or hidden
    pad = c["pad_token_id"]
    if pad is not None and not (
        isinstance(pad, int) and not isinstance(pad, bool) and 0 <= pad < c["vocab_size"]
    ):
        raise config_error(name, "pad_token_id", pad, "null or a token id below vocab_size")
    return c


def layer_norm(size: int, c: dict[str, Any], dtype: Any) -> nn.LayerNorm:
    return nn.LayerNorm(size, eps=c["layer_norm_eps"], dtype=dtype)


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> DebertaV2Layer:
    hidden, inter = c["hidden_size"], c["intermediate_size"]
    ks = jax.random.split(key, 7)
    relative, types, shared = c["relative_attention"], c["pos_att_type"], c["share_att_key"]
    separate = relative and not shared

    def out_block(n_in: int, k: PRNGKeyArray) -> BertSelfOutput:
        return BertSelfOutput(
            dense=nn.Linear(n_in, hidden, dtype=dtype, key=k),
            LayerNorm=layer_norm(hidden, c, dtype),
            dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
        )

    attention = DisentangledSelfAttention(
        query_proj=nn.Linear(hidden, hidden, dtype=dtype, key=ks[0]),
        key_proj=nn.Linear(hidden, hidden, dtype=dtype, key=ks[1]),
        value_proj=nn.Linear(hidden, hidden, dtype=dtype, key=ks[2]),
        pos_key_proj=nn.Linear(hidden, hidden, dtype=dtype, key=ks[3])
        if separate and "c2p" in types
        else None,
        pos_query_proj=nn.Linear(hidden, hidden, dtype=dtype, key=ks[4])
        if separate and "p2c" in types
        else None,
        pos_dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True) if relative else None,
        dropout=nn.Dropout(c["attention_probs_dropout_prob"], inference=True),
        num_heads=c["num_attention_heads"],
        pos_att_type=types,
        relative=relative,
        share_att_key=shared,
        att_span=c["att_span"],
    )
    return DebertaV2Layer(
        attention=DebertaV2Attention(attention, out_block(hidden, ks[5])),
        intermediate=BertIntermediate(
            dense=nn.Linear(hidden, inter, dtype=dtype, key=ks[6]), act=c["hidden_act"]
        ),
        output=out_block(inter, jax.random.fold_in(key, 1)),
    )


def build_deberta(c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> tuple[Any, Any]:
    hidden, emb = c["hidden_size"], c["embedding_size"]
    k_word, k_pos, k_type, k_proj, k_layers, k_rel, k_conv = jax.random.split(key, 7)
    word = nn.Embedding(c["vocab_size"], emb, dtype=dtype, key=k_word)
    if c["pad_token_id"] is not None:  # PyTorch's padding_idx: the padding row starts at zero
        word = nn.Embedding(weight=word.weight.at[c["pad_token_id"]].set(0))
    positions = c["max_position_embeddings"]
    types = c["type_vocab_size"]
    embeddings = DebertaV2Embeddings(
        word_embeddings=word,
        position_embeddings=nn.Embedding(positions, emb, dtype=dtype, key=k_pos)
        if c["position_biased_input"]
        else None,
        token_type_embeddings=nn.Embedding(types, emb, dtype=dtype, key=k_type) if types else None,
        embed_proj=nn.Linear(emb, hidden, False, dtype, key=k_proj) if emb != hidden else None,
        LayerNorm=layer_norm(hidden, c, dtype),
        dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
    )
    conv = None
    if c["conv_kernel_size"]:
        kernel = c["conv_kernel_size"]
        conv = DebertaV2ConvLayer(
            conv=nn.Conv1d(
                hidden,
                hidden,
                kernel,
                padding=(kernel - 1) // 2,
                groups=c["conv_groups"],
                dtype=dtype,
                key=k_conv,
            ),
            LayerNorm=layer_norm(hidden, c, dtype),
            dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
            act=c["conv_act"],
        )
    relative = c["relative_attention"]
    encoder = DebertaV2Encoder(
        layer=nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=k_layers),
        rel_embeddings=nn.Embedding(2 * c["att_span"], hidden, dtype=dtype, key=k_rel)
        if relative
        else None,
        LayerNorm=layer_norm(hidden, c, dtype) if c["norm_rel_ebd"] else None,
        conv=conv,
        buckets=c["position_buckets"],
        max_relative=c["max_relative_positions"],
    )
    return embeddings, encoder


@register_architecture
class DebertaV2Model(PretrainedModel):
    """DeBERTa-v2's encoder (`transformers.DebertaV2Model`): returns `last_hidden_state`.

    Disentangled attention: content scores plus, with `relative_attention`, content-to-position
    (`"c2p"`) and position-to-content (`"p2c"`) scores of relative positions (log-bucketed with
    `position_buckets`), scaled by `sqrt(head_dim * (1 + len(pos_att_type)))`. Call it with
    `input_ids` `(batch, seq)` (or `inputs_embeds`), optionally `attention_mask`,
    `token_type_ids` and `position_ids`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.deberta_v2 import DebertaV2Model
        >>> config = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 2,
        ...           "num_attention_heads": 2, "intermediate_size": 32,
        ...           "relative_attention": True, "pos_att_type": "p2c|c2p",
        ...           "position_buckets": 8, "max_relative_positions": 32}
        >>> model = DebertaV2Model.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[1, 2, 3]]), attention_mask=jnp.array([[1, 1, 0]])).shape
        (1, 3, 16)
        >>> model.encoder.rel_embeddings.weight.shape   # 2 * position_buckets
        (16, 16)
    """

    architecture = "DebertaV2Model"
    model_type = "deberta-v2"
    base_model_prefix = "deberta"
    keys_to_ignore_on_load_unexpected = IGNORED_KEYS

    embeddings: DebertaV2Embeddings
    encoder: DebertaV2Encoder

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `DebertaV2Config` dict.

        Arguments:
            config: the config; keys it lacks take `DebertaV2Config`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        embeddings, encoder = build_deberta(read_deberta(cls.__name__, config), key, dtype)
        return cls(config=config, embeddings=embeddings, encoder=encoder)

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
            inputs_embeds: word embeddings `(batch, seq, embedding_size)`.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`, `(batch, seq, hidden)`.
        """
        name = type(self).__name__
        k_emb, k_enc = split_key(key, 2)
        words, _ = embed_inputs(name, input_ids, inputs_embeds, self.embeddings.word_embeddings)
        shape = (words.shape[0], words.shape[1])
        mask = check_ids(name, "attention_mask", attention_mask, shape)
        mask = jnp.ones(shape, bool) if mask is None else mask.astype(bool)
        types = check_ids(name, "token_type_ids", token_type_ids, shape)
        types = jnp.zeros(shape, jnp.int32) if types is None else types
        positions = check_ids(name, "position_ids", position_ids, None)
        positions = jnp.arange(shape[1])[None] if positions is None else positions
        x = self.embeddings(words, types, positions, mask, key=k_emb)
        return self.encoder(x, mask, key=k_enc)
