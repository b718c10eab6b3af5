"""DINOv2: `Dinov2Model`, `Dinov2ForImageClassification` (`transformers` 5's module names).

A ViT with layer scale (`layer_scale1.lambda1`, `layer_scale2.lambda1`), `norm1`/`norm2`, an
optional SwiGLU feed-forward block and a mask token; the patch embedding and the attention are
ViT's (`_vit.py`). `transformers` 5 names the attention `attention.q_proj` in memory but its
files keep `attention.attention.query`; `load_renames`/`save_renames` convert as it does. Its
SwiGLU block is `gate_proj`/`up_proj` in memory, one fused `weights_in` in the files: treemod
keeps the files' fused `mlp.weights_in` and `mlp.weights_out` (one matrix product instead of
two). Models are built in inference mode; stochastic depth (`drop_path_rate`) acts in training
only and is not applied.
"""

# exports: Dinov2Model, Dinov2ForImageClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module
from treemod._sharding.axes import axis_names

from ._attention_parts import projection_keys, split_key, unwrapped
from ._axis_layouts import mlp_out
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert_layers import attention_bias
from ._config_values import Value, num_labels, read_config
from ._hf_activations import hf_activation
from ._vit import ViTAttention, ViTMLP, ViTPatchEmbeddings, _pair
from ._vit_interpolate import resize_grid

__all__ = ["Dinov2Model", "Dinov2ForImageClassification"]

# The values these classes read, with `transformers.Dinov2Config`'s defaults. The backbone's
# values (out_features, apply_layernorm, reshape_hidden_states) are read by Dinov2Backbone only.
_VALUES: dict[str, Value] = {
    "hidden_size": Value(768, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "mlp_ratio": Value(4, "size"),  # an int in Dinov2Config
    "hidden_act": Value("gelu"),
    "hidden_dropout_prob": Value(0.0, "prob"),
    "attention_probs_dropout_prob": Value(0.0, "prob"),
    "layer_norm_eps": Value(1e-6, "positive"),
    "image_size": Value(224),
    "patch_size": Value(14),
    "num_channels": Value(3, "size"),
    "qkv_bias": Value(True, "bool"),
    "layerscale_value": Value(1.0),  # the initial scale, checked to be a number
    "drop_path_rate": Value(0.0, "prob"),
    "use_swiglu_ffn": Value(False, "bool"),
    "use_mask_token": Value(True, "bool"),
}


def _read(cls_name: str, config: PretrainedConfig) -> dict[str, Any]:
    c = read_config(cls_name, config, _VALUES)
    hf_activation(cls_name, "hidden_act", c["hidden_act"])
    scale = c["layerscale_value"]
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise config_error(cls_name, "layerscale_value", scale, "a number")
    c["image_size"] = _pair(cls_name, config, "image_size", 224)
    c["patch_size"] = _pair(cls_name, config, "patch_size", 14)
    (h, w), (ph, pw) = c["image_size"], c["patch_size"]
    if h != w:
        # transformers resizes the position embeddings of every non-square image (bicubic).
        raise config_error(cls_name, "image_size", config.get("image_size"), "a square size")
    if h < ph or w < pw:
        raise config_error(cls_name, "patch_size", config.get("patch_size"), f"at most {h}")
    head_dim = config.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise config_error(cls_name, "head_dim", head_dim, "a positive integer")
    c["head_dim"] = head_dim
    c["mlp_hidden"] = c["hidden_size"] * c["mlp_ratio"]
    c["grid"] = (h // ph, w // pw)
    return c


@axis_names({"lambda1": ("norm",)})
class Dinov2LayerScale(Module):
    """A learned per-channel scale."""

    lambda1: Array

    def __call__(self, x: Array) -> Array:
        """`x * lambda1`."""
        return x * self.lambda1.astype(x.dtype).reshape((1,) * (x.ndim - 1) + (-1,))


@axis_names(mlp_out("weights_out"))
class Dinov2SwiGLUFFN(Module):
    """`weights_out(silu(gate) * up)`, gate and up the halves of `weights_in(x)`."""

    weights_in: nn.Linear
    weights_out: nn.Linear

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The feed-forward block (`key`: the projections', for LoRA dropout)."""
        k_in, k_out = projection_keys(key, 2)
        gate, up = jnp.split(self.weights_in(x, key=k_in), 2, axis=-1)
        return self.weights_out(jax.nn.silu(gate) * up, key=k_out)


class Dinov2Layer(Module):
    """One pre-norm encoder layer with layer scale."""

    norm1: nn.LayerNorm
    attention: ViTAttention
    layer_scale1: Dinov2LayerScale
    norm2: nn.LayerNorm
    mlp: ViTMLP | Dinov2SwiGLUFFN
    layer_scale2: Dinov2LayerScale

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        x = x + self.layer_scale1(self.attention(self.norm1(x), bias, key=key))
        # The attention draws its projections' keys from `key` itself: the MLP another stream.
        (k_mlp,) = projection_keys(key, 1, stream=1)
        return x + self.layer_scale2(self.mlp(self.norm2(x), key=k_mlp))


class Dinov2Encoder(Module):
    """The layers (`encoder.layer.{i}`)."""

    layer: nn.Stack

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` through every layer."""
        out: Array = self.layer(x, bias, key=key)
        return out


@axis_names(
    {
        "cls_token": (None, None, "embed"),
        "mask_token": (None, "embed"),
        "position_embeddings": (None, None, "embed"),
    }
)
class Dinov2Embeddings(Module):
    """The CLS token, the patch embeddings (masked ones replaced by the mask token), positions."""

    cls_token: Array
    mask_token: Array | None
    patch_embeddings: ViTPatchEmbeddings
    position_embeddings: Array
    dropout: nn.Dropout

    def positions(self, owner: str, height: int, width: int) -> Array:
        """The position embeddings `(1, 1 + patches, hidden)` for an image of `height x width`:
        the table itself at its own square grid, else its patch part resized as `transformers`
        resizes it (PyTorch's bicubic kernel, in float32)."""
        table = self.position_embeddings
        ph, pw = unwrapped(self.patch_embeddings.projection).kernel_size
        grid, n = (height // ph, width // pw), table.shape[1] - 1
        if grid[0] * grid[1] == n and height == width:
            return table
        side = int(n**0.5)
        if side * side != n:
            raise ValueError(
                f"{owner}: pixel_values of {height}x{width} need the {n} position embeddings "
                "resized, which transformers does from a square grid; the config's patch grid "
                "is not square."
            )
        resized = resize_grid(table[0, 1:], grid)[None]
        return jnp.concatenate([table[:, :1], resized], axis=1)

    def __call__(
        self,
        pixel_values: Array,
        bool_masked_pos: Array | None,
        positions: Array,
        *,
        key: PRNGKeyArray | None,
    ) -> Array:
        """`(batch, channels, height, width)` to `(batch, 1 + patches, hidden)`."""
        x = self.patch_embeddings(pixel_values, key=projection_keys(key, 1)[0])
        if bool_masked_pos is not None:
            assert self.mask_token is not None
            mask = bool_masked_pos.astype(x.dtype)[..., None]
            x = x * (1 - mask) + self.mask_token.astype(x.dtype)[None] * mask
        cls = jnp.broadcast_to(self.cls_token.astype(x.dtype), (x.shape[0], 1, x.shape[2]))
        x = jnp.concatenate([cls, x], axis=1) + positions.astype(x.dtype)
        return self.dropout(x, key=key)


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> Dinov2Layer:
    hidden, inner = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    ks = jax.random.split(key, 6)

    def qkv(k: PRNGKeyArray) -> nn.Linear:
        return nn.Linear(hidden, inner, use_bias=c["qkv_bias"], dtype=dtype, key=k)

    def norm() -> nn.LayerNorm:
        return nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)

    def scale() -> Dinov2LayerScale:
        value = jnp.full((hidden,), c["layerscale_value"], dtype or jnp.float32)
        return Dinov2LayerScale(value)

    attention = ViTAttention(
        q_proj=qkv(ks[0]),
        k_proj=qkv(ks[1]),
        v_proj=qkv(ks[2]),
        o_proj=nn.Linear(inner, hidden, dtype=dtype, key=ks[3]),
        dropout=nn.Dropout(c["attention_probs_dropout_prob"], inference=True),
        num_heads=c["num_attention_heads"],
    )
    mlp: ViTMLP | Dinov2SwiGLUFFN
    if c["use_swiglu_ffn"]:
        features = (int(c["mlp_hidden"] * 2 / 3) + 7) // 8 * 8
        mlp = Dinov2SwiGLUFFN(
            nn.Linear(hidden, 2 * features, dtype=dtype, key=ks[4]),
            nn.Linear(features, hidden, dtype=dtype, key=ks[5]),
        )
    else:
        mlp = ViTMLP(
            fc1=nn.Linear(hidden, c["mlp_hidden"], dtype=dtype, key=ks[4]),
            fc2=nn.Linear(c["mlp_hidden"], hidden, dtype=dtype, key=ks[5]),
            act=c["hidden_act"],
        )
    return Dinov2Layer(norm(), attention, scale(), norm(), mlp, scale())


def _build(c: dict[str, Any], key: PRNGKeyArray, dtype: Any) -> dict[str, Any]:
    hidden = c["hidden_size"]
    k_cls, k_patch, k_pos, k_layers = jax.random.split(key, 4)
    dtype_ = jnp.zeros((), dtype if dtype is not None else jnp.float32).dtype
    patches = c["grid"][0] * c["grid"][1]
    embeddings = Dinov2Embeddings(
        cls_token=jax.random.normal(k_cls, (1, 1, hidden), dtype_),
        mask_token=jnp.zeros((1, hidden), dtype_) if c["use_mask_token"] else None,
        patch_embeddings=ViTPatchEmbeddings(
            nn.Conv2d(
                c["num_channels"],
                hidden,
                kernel_size=c["patch_size"],
                stride=c["patch_size"],
                dtype=dtype,
                key=k_patch,
            )
        ),
        position_embeddings=jax.random.normal(k_pos, (1, patches + 1, hidden), dtype_),
        dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
    )
    layers = nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=k_layers)
    layernorm = nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)
    return {"embeddings": embeddings, "encoder": Dinov2Encoder(layers), "layernorm": layernorm}


# `transformers` 5's conversion mapping for DINOv2 (its files keep the older attention names).
DINOV2_LOAD_RENAMES: tuple[tuple[str, str], ...] = (
    (r"attention\.attention\.query\.", "attention.q_proj."),
    (r"attention\.attention\.key\.", "attention.k_proj."),
    (r"attention\.attention\.value\.", "attention.v_proj."),
    (r"attention\.output\.dense\.", "attention.o_proj."),
)
DINOV2_SAVE_RENAMES: tuple[tuple[str, str], ...] = (
    (r"attention\.q_proj\.", "attention.attention.query."),
    (r"attention\.k_proj\.", "attention.attention.key."),
    (r"attention\.v_proj\.", "attention.attention.value."),
    (r"attention\.o_proj\.", "attention.output.dense."),
)


@register_architecture
class Dinov2Model(PretrainedModel):
    """DINOv2's encoder (`transformers.Dinov2Model`): returns `last_hidden_state`.

    Call it with `pixel_values` `(batch, num_channels, height, width)` of any size: other grids
    than the config's `image_size`'s resize the position embeddings as `transformers` does
    (PyTorch's bicubic kernel). `pooler_output` gives `transformers`' `pooler_output` (the
    normalised CLS token).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.dinov2 import Dinov2Model
        >>> config = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        ...           "image_size": 8, "patch_size": 4}
        >>> model = Dinov2Model.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((1, 3, 8, 8))).shape   # CLS + 4 patches
        (1, 5, 16)
        >>> model.pooler_output(pixel_values=jnp.ones((1, 3, 8, 8))).shape
        (1, 16)
    """

    architecture = "Dinov2Model"
    model_type = "dinov2"
    load_renames = DINOV2_LOAD_RENAMES
    save_renames = DINOV2_SAVE_RENAMES
    base_model_prefix = "dinov2"

    embeddings: Dinov2Embeddings
    encoder: Dinov2Encoder
    layernorm: nn.LayerNorm

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `Dinov2Config` dict.

        Arguments:
            config: the config; keys it lacks take `Dinov2Config`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        c = _read(cls.__name__, config)
        return cls(config=config, **_build(c, key, dtype))

    def __call__(
        self,
        *,
        pixel_values: Any,
        bool_masked_pos: Any = None,
        attention_mask: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`last_hidden_state` `(batch, 1 + patches, hidden)`.

        Arguments:
            pixel_values: `(batch, num_channels, height, width)`, cast to the parameters' dtype.
            bool_masked_pos: optional `(batch, patches)` booleans, True where the mask token
                replaces the patch (needs `use_mask_token`).
            attention_mask: optional `(batch, 1 + patches)`, 1 to attend, 0 to mask.
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`.
        """
        name = type(self).__name__
        projection = unwrapped(self.embeddings.patch_embeddings.projection)
        x = jnp.asarray(pixel_values).astype(projection.weight.dtype)
        ph, pw = projection.kernel_size
        if x.ndim != 4 or x.shape[1] != projection.in_channels:
            raise ValueError(
                f"{name}: pixel_values has shape {x.shape}; expected (batch, "
                f"{projection.in_channels}, height, width)."
            )
        if x.shape[2] < ph or x.shape[3] < pw:
            raise ValueError(f"{name}: pixel_values {x.shape} are smaller than one patch.")
        positions = self.embeddings.positions(name, x.shape[2], x.shape[3])
        patches = (x.shape[2] // ph) * (x.shape[3] // pw)
        masked = None
        if bool_masked_pos is not None:
            if self.embeddings.mask_token is None:
                raise ValueError(f"{name}: bool_masked_pos needs a config with use_mask_token.")
            masked = jnp.asarray(bool_masked_pos)
            if masked.shape != (x.shape[0], patches):
                raise ValueError(
                    f"{name}: bool_masked_pos has shape {masked.shape}; expected (batch, "
                    f"patches) = {(x.shape[0], patches)}."
                )
        k_emb, k_layers = split_key(key, 2)
        x = self.embeddings(x, masked, positions, key=k_emb)
        bias = attention_bias(attention_mask, (x.shape[0], x.shape[1]), x.dtype)
        return self.layernorm(self.encoder(x, bias, key=k_layers))

    def pooler_output(self, **inputs: Any) -> Array:
        """`transformers`' `pooler_output` `(batch, hidden)`: the normalised CLS token.

        Arguments:
            inputs: `__call__`'s arguments.

        Returns:
            `last_hidden_state[:, 0]`.
        """
        return self(**inputs)[:, 0]


@register_architecture
class Dinov2ForImageClassification(PretrainedModel):
    """DINOv2 with a linear classifier on the CLS token and the patch tokens' mean
    (`transformers.Dinov2ForImageClassification`): `logits` `(batch, num_labels)`.

    With `num_labels` 0 the classifier is the identity (the `2 * hidden` features), as in
    `transformers`. Called as `Dinov2Model` is, without `bool_masked_pos`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.dinov2 import Dinov2ForImageClassification
        >>> config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...           "image_size": 8, "patch_size": 4, "num_labels": 10}
        >>> model = Dinov2ForImageClassification.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((2, 3, 8, 8))).shape
        (2, 10)
    """

    architecture = "Dinov2ForImageClassification"
    model_type = "dinov2"
    load_renames = DINOV2_LOAD_RENAMES
    save_renames = DINOV2_SAVE_RENAMES
    base_model_prefix = "dinov2"

    dinov2: Dinov2Model
    classifier: nn.Linear | nn.Identity

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `Dinov2Config` dict (see `Dinov2Model`)."""
        config = PretrainedConfig(config)
        labels = num_labels(cls.__name__, config)
        k_model, k_cls = jax.random.split(key)
        c = _read(cls.__name__, config)
        dinov2 = Dinov2Model(config=config, **_build(c, k_model, dtype))
        classifier: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            classifier = nn.Linear(2 * c["hidden_size"], labels, dtype=dtype, key=k_cls)
        return cls(config=config, dinov2=dinov2, classifier=classifier)

    def __call__(
        self, *, pixel_values: Any, attention_mask: Any = None, key: PRNGKeyArray | None = None
    ) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `Dinov2Model`'s."""
        hidden = self.dinov2(pixel_values=pixel_values, attention_mask=attention_mask, key=key)
        features = jnp.concatenate([hidden[:, 0], hidden[:, 1:].mean(axis=1)], axis=-1)
        # The body takes `key` itself: the classifier's key comes from another stream.
        out: Array = self.classifier(features, key=projection_keys(key, 1, stream=1)[0])
        return out
