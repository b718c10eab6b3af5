"""Whisper's layers: attention, encoder and decoder layers, the encoder and the decoder.

Attribute names are `transformers`' (`layers.0.self_attn.q_proj`, `encoder_attn`, `fc1`,
`self_attn_layer_norm`), every projection an `nn.Linear`, so `tm.state_dict` names them as
`transformers` does and PEFT's `target_modules` (`q_proj`, `v_proj`) select them. Layers are
tuples, numbered as `transformers`' module lists. The encoder's sinusoidal positions are a
weight as the checkpoint stores it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names
from treemod.models._attention_parts import attend, projection_keys, split_key
from treemod.models._axis_layouts import attention_in, attention_out, mlp_out, positions
from treemod.models._causal_lm import KVCache
from treemod.models._hf_activations import get_activation

__all__ = [
    "WhisperAttention",
    "WhisperDecoder",
    "WhisperDecoderLayer",
    "WhisperEncoder",
    "WhisperEncoderLayer",
    "build_decoder",
    "build_encoder",
    "sinusoids",
]


def sinusoids(length: int, channels: int, max_timescale: float = 10000) -> np.ndarray:
    """Whisper's sinusoidal position table `(length, channels)`: sines, then cosines."""
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv = np.exp(-increment * np.arange(channels // 2, dtype=np.float32))
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv[None, :].astype(np.float32)
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32)


@axis_names({**attention_in("q_proj", "k_proj", "v_proj"), **attention_out("out_proj")})
class WhisperAttention(Module):
    """Multi-head attention; the queries scaled by `head_dim**-0.5` before the product, as
    Whisper's (no bias on `k_proj`)."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    out_proj: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)
    head_dim: int = field(static=True)

    def keys_values(
        self, states: Array, *, keys: tuple[PRNGKeyArray | None, PRNGKeyArray | None] = (None, None)
    ) -> tuple[Array, Array]:
        """Keys and values `(batch, len, heads, head_dim)` of `states` (`keys`: `k_proj`'s and
        `v_proj`'s, for LoRA dropout)."""
        batch, length, _ = states.shape
        shape = (batch, length, self.num_heads, self.head_dim)
        k = self.k_proj(states, key=keys[0]).reshape(shape)
        return k, self.v_proj(states, key=keys[1]).reshape(shape)

    def __call__(
        self,
        x: Array,
        mask: Array | None,
        *,
        states: Array | None = None,
        kv: tuple[Array, Array] | None = None,
        cache: KVCache | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, KVCache | None]:
        """Attention output `(batch, q_len, d_model)`.

        Arguments:
            x: normalised hidden states, the queries (and self-attention's keys and values).
            mask: `None` or booleans broadcasting to `(batch, 1, q_len, keys)`.
            states: the encoder's hidden states, for cross-attention.
            kv: precomputed cross-attention keys and values (`generate_seq2seq`).
            cache: `generate_seq2seq`'s self-attention cache.
            key: dropout key (training mode only).

        Returns:
            `(output, cache)`.
        """
        batch, q_len, _ = x.shape
        scale = jnp.asarray(self.head_dim**-0.5, x.dtype)
        kq, kk, kv_key, ko = projection_keys(key, 4)
        q = (self.q_proj(x, key=kq) * scale).reshape(batch, q_len, self.num_heads, self.head_dim)
        if kv is not None:
            k, v = kv
        else:
            k, v = self.keys_values(x if states is None else states, keys=(kk, kv_key))
        if cache is not None:
            cache, k, v = cache.write(k, v)
        out = attend(q, k, v, mask, scale=1.0, dropout=self.dropout, key=key)
        return self.out_proj(out.reshape(batch, q_len, -1), key=ko), cache


@axis_names(mlp_out("fc2"))
class _FeedForward(Module):
    fc1: nn.Linear
    fc2: nn.Linear
    final_layer_norm: nn.LayerNorm
    activation_dropout: nn.Dropout
    dropout: nn.Dropout
    act: str = field(static=True)

    def feed_forward(self, x: Array, k1: Any, k2: Any) -> Array:
        k_fc1, k_fc2 = projection_keys(k1, 2)
        h = get_activation(self.act)(self.fc1(self.final_layer_norm(x), key=k_fc1))
        h = self.fc2(self.activation_dropout(h, key=k1), key=k_fc2)
        return x + self.dropout(h, key=k2)


class WhisperEncoderLayer(_FeedForward):
    """Pre-norm self-attention then the feed-forward, each added to its input."""

    self_attn: WhisperAttention
    self_attn_layer_norm: nn.LayerNorm

    def __call__(self, x: Array, key: PRNGKeyArray | None) -> Array:
        """One layer over `(batch, frames, d_model)`."""
        keys = split_key(key, 4)
        h, _ = self.self_attn(self.self_attn_layer_norm(x), None, key=keys[0])
        x = x + self.dropout(h, key=keys[1])
        return self.feed_forward(x, keys[2], keys[3])


class WhisperDecoderLayer(_FeedForward):
    """Causal self-attention, cross-attention over the encoder, the feed-forward (pre-norm)."""

    self_attn: WhisperAttention
    self_attn_layer_norm: nn.LayerNorm
    encoder_attn: WhisperAttention
    encoder_attn_layer_norm: nn.LayerNorm

    def __call__(
        self,
        x: Array,
        mask: Array,
        states: Array | None,
        kv: tuple[Array, Array] | None,
        cache: KVCache | None,
        key: PRNGKeyArray | None,
    ) -> tuple[Array, KVCache | None]:
        """One layer over `(batch, q_len, d_model)`."""
        keys = split_key(key, 6)
        h, cache = self.self_attn(self.self_attn_layer_norm(x), mask, cache=cache, key=keys[0])
        x = x + self.dropout(h, key=keys[1])
        h, _ = self.encoder_attn(
            self.encoder_attn_layer_norm(x), None, states=states, kv=kv, key=keys[2]
        )
        x = x + self.dropout(h, key=keys[3])
        return self.feed_forward(x, keys[4], keys[5]), cache


def _training_refusal(owner: str, dropout: nn.Dropout, layerdrop: float, name: str) -> None:
    if layerdrop > 0 and not dropout.inference:
        raise ValueError(
            f"{owner}: {name}={layerdrop} drops whole layers in training mode, which treemod "
            f"does not implement; set it to 0 (or run in inference mode)."
        )


@axis_names(positions("embed_positions"))
class WhisperEncoder(Module):
    """Two gelu convolutions over the log-mel frames (the second halving them), the stored
    sinusoidal positions, the layers, a final LayerNorm."""

    conv1: nn.Conv1d
    conv2: nn.Conv1d
    embed_positions: nn.Embedding
    layers: tuple[WhisperEncoderLayer, ...]
    layer_norm: nn.LayerNorm
    dropout: nn.Dropout
    layerdrop: float = field(static=True)
    spec_augment: bool = field(static=True)

    def __call__(self, features: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The last hidden states `(batch, max_source_positions, d_model)`.

        Arguments:
            features: log-mel features `(batch, num_mel_bins, 2 * max_source_positions)`.
            key: dropout key (training mode only).
        """
        return self.hidden_states(features, key=key)[-1]

    def hidden_states(self, features: Array, *, key: PRNGKeyArray | None = None) -> list[Array]:
        """The embedded frames, each layer's output but the last, and the normalised last
        hidden states: `transformers`' `hidden_states` (`encoder_layers + 1` arrays)."""
        _training_refusal("WhisperEncoder", self.dropout, self.layerdrop, "encoder_layerdrop")
        if self.spec_augment and not self.dropout.inference:
            raise ValueError(
                "WhisperEncoder: apply_spec_augment masks input features in training mode, "
                "which treemod does not implement; set it to false (or run in inference mode)."
            )
        gelu = get_activation("gelu")
        k_conv1, k_conv2 = projection_keys(key, 2)
        h = gelu(self.conv2(gelu(self.conv1(features, key=k_conv1)), key=k_conv2))
        h = jnp.swapaxes(h, 1, 2) + self.embed_positions.weight.astype(h.dtype)[None]
        keys = split_key(key, len(self.layers) + 1)
        states = [self.dropout(h, key=keys[0])]
        for layer, k in zip(self.layers, keys[1:], strict=True):
            states.append(layer(states[-1], k))
        states[-1] = self.layer_norm(states[-1])
        return states


@axis_names(positions("embed_positions"))
class WhisperDecoder(Module):
    """Token and learned position embeddings, the layers, a final LayerNorm."""

    embed_tokens: nn.Embedding
    embed_positions: nn.Embedding
    layers: tuple[WhisperDecoderLayer, ...]
    layer_norm: nn.LayerNorm
    dropout: nn.Dropout
    layerdrop: float = field(static=True)

    def __call__(
        self,
        ids: Array,
        positions: Array,
        mask: Array,
        *,
        states: Array | None = None,
        cross: tuple[tuple[Array, ...], tuple[Array, ...]] | None = None,
        cache: KVCache | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, KVCache | None]:
        """The last hidden states `(batch, q_len, d_model)` and the cache.

        Arguments:
            ids: `(batch, q_len)` token ids.
            positions: `(batch, q_len)` positions (below `max_target_positions`).
            mask: the self-attention mask `(batch or 1, 1, q_len, keys)`.
            states: the encoder's last hidden states (without `cross`).
            cross: precomputed cross-attention keys and values, per layer.
            cache: the self-attention cache (`generate_seq2seq`).
            key: dropout key (training mode only).
        """
        _training_refusal("WhisperDecoder", self.dropout, self.layerdrop, "decoder_layerdrop")
        h = self.embed_tokens(ids) + self.embed_positions.weight[positions]
        keys = split_key(key, len(self.layers) + 1)
        h = self.dropout(h, key=keys[0])
        for i, layer in enumerate(self.layers):
            kv = None if cross is None else (cross[0][i], cross[1][i])
            h, cache = layer(h, mask, states, kv, cache, keys[i + 1])
        return self.layer_norm(h), cache


class _Builder:
    """Layers with `transformers`' initialisation (normal(init_std) weights, zero biases)."""

    def __init__(self, v: dict[str, Any], dtype: Any, key: PRNGKeyArray, count: int) -> None:
        self.v, self.dtype = v, dtype
        self.keys = iter(jax.random.split(key, count))

    def linear(self, n_in: int, n_out: int, bias: bool = True) -> nn.Linear:
        init = nn.init.normal(self.v["init_std"])
        return nn.Linear(
            n_in, n_out, bias, self.dtype, weight_init=init, bias_init=nn.init.zeros,
            key=next(self.keys),
        )  # fmt: skip

    def norm(self) -> nn.LayerNorm:
        return nn.LayerNorm(self.v["d_model"], 1e-5, dtype=self.dtype)

    def drop(self, name: str) -> nn.Dropout:
        # Inference mode, as transformers' from_pretrained gives an eval() model.
        return nn.Dropout(self.v[name], inference=True)

    def attention(self, heads: int) -> WhisperAttention:
        d = self.v["d_model"]
        return WhisperAttention(
            q_proj=self.linear(d, d),
            k_proj=self.linear(d, d, bias=False),
            v_proj=self.linear(d, d),
            out_proj=self.linear(d, d),
            dropout=self.drop("attention_dropout"),
            num_heads=heads,
            head_dim=d // heads,
        )

    def feed_forward(self, inner: int) -> dict[str, Any]:
        d = self.v["d_model"]
        return {
            "fc1": self.linear(d, inner),
            "fc2": self.linear(inner, d),
            "final_layer_norm": self.norm(),
            "activation_dropout": self.drop("activation_dropout"),
            "dropout": self.drop("dropout"),
            "act": self.v["activation_function"],
        }

    def embedding(self, rows: int) -> nn.Embedding:
        init = nn.init.normal(self.v["init_std"])
        return nn.Embedding(
            rows, self.v["d_model"], dtype=self.dtype, weight_init=init, key=next(self.keys)
        )


def build_encoder(v: dict[str, Any], dtype: Any, *, key: PRNGKeyArray) -> WhisperEncoder:
    """The encoder from config values `v`, with `transformers`' initialisation."""
    b = _Builder(v, dtype, key, 8 * v["encoder_layers"] + 4)
    d, mels, length = v["d_model"], v["num_mel_bins"], v["max_source_positions"]
    heads = v["encoder_attention_heads"]
    conv1 = nn.Conv1d(mels, d, 3, padding=1, dtype=dtype, key=next(b.keys))
    conv2 = nn.Conv1d(d, d, 3, stride=2, padding=1, dtype=dtype, key=next(b.keys))
    positions = nn.Embedding(weight=jnp.asarray(sinusoids(length, d), dtype))
    layers = tuple(
        WhisperEncoderLayer(
            self_attn=b.attention(heads),
            self_attn_layer_norm=b.norm(),
            **b.feed_forward(v["encoder_ffn_dim"]),
        )
        for _ in range(v["encoder_layers"])
    )
    return WhisperEncoder(
        conv1=conv1,
        conv2=conv2,
        embed_positions=positions,
        layers=layers,
        layer_norm=b.norm(),
        dropout=b.drop("dropout"),
        layerdrop=float(v["encoder_layerdrop"]),
        spec_augment=bool(v["apply_spec_augment"]),
    )


def build_decoder(v: dict[str, Any], dtype: Any, *, key: PRNGKeyArray) -> WhisperDecoder:
    """The decoder from config values `v`, with `transformers`' initialisation."""
    b = _Builder(v, dtype, key, 12 * v["decoder_layers"] + 4)
    heads = v["decoder_attention_heads"]
    layers = tuple(
        WhisperDecoderLayer(
            self_attn=b.attention(heads),
            self_attn_layer_norm=b.norm(),
            encoder_attn=b.attention(heads),
            encoder_attn_layer_norm=b.norm(),
            **b.feed_forward(v["decoder_ffn_dim"]),
        )
        for _ in range(v["decoder_layers"])
    )
    return WhisperDecoder(
        embed_tokens=b.embedding(v["vocab_size"]),
        embed_positions=b.embedding(v["max_target_positions"]),
        layers=layers,
        layer_norm=b.norm(),
        dropout=b.drop("dropout"),
        layerdrop=float(v["decoder_layerdrop"]),
    )
