"""ViT: `ViTModel`, `ViTForImageClassification` (`transformers` 5's module names).

`transformers` 5 names ViT's parameters `vit.layers.{i}.attention.q_proj.weight`,
`...mlp.fc1.weight` in memory, but its files (the Hub's, and what `save_pretrained` writes)
keep the older names `vit.encoder.layer.{i}.attention.attention.query.weight`; it renames them
when loading. These classes carry the in-memory names, so `tm.load_state_dict` takes
`hf_model.state_dict()` as it is; `from_pretrained` and `save_pretrained` rename to and from
the files' names as `transformers` does. Models are built in inference mode (dropout off).
"""

# exports: ViTModel, ViTForImageClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import projection_keys, split_key, unwrapped
from ._axis_layouts import attention_in, attention_out, mlp_out
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._bert_layers import BertPooler, attend_encoder, attention_bias
from ._config_values import Value, num_labels, read_config
from ._hf_activations import get_activation, hf_activation
from ._vit_interpolate import resize_grid

__all__ = ["ViTModel", "ViTForImageClassification"]

# The values these classes read, with `transformers.ViTConfig`'s defaults.
_VALUES: dict[str, Value] = {
    "hidden_size": Value(768, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "intermediate_size": Value(3072, "size"),
    "hidden_act": Value("gelu"),
    "hidden_dropout_prob": Value(0.0, "prob"),
    "attention_probs_dropout_prob": Value(0.0, "prob"),
    "layer_norm_eps": Value(1e-12, "positive"),
    "image_size": Value(224),  # checked by `_pair`
    "patch_size": Value(16),
    "num_channels": Value(3, "size"),
    "qkv_bias": Value(True, "bool"),
    "pooler_output_size": Value(None),
    "pooler_act": Value("tanh"),
}


def _pair(
    cls_name: str, config: PretrainedConfig, key: str, default: Any = None
) -> tuple[int, int]:
    """`config[key]` (else `default`, else ViT's) as `(height, width)`, each a positive int."""
    value = config.get(key, _VALUES[key].default if default is None else default)
    pair = value if isinstance(value, tuple) else (value, value)
    if len(pair) != 2 or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair
    ):
        raise config_error(cls_name, key, value, "a positive integer or a pair of them")
    return (pair[0], pair[1])


def _read(cls_name: str, config: PretrainedConfig) -> dict[str, Any]:
    """The config values ViT reads, checked; refused values raise `CheckpointError`."""
    c = read_config(cls_name, config, _VALUES)
    for key in ("hidden_act", "pooler_act"):
        hf_activation(cls_name, key, c[key])
    c["image_size"] = _pair(cls_name, config, "image_size")
    c["patch_size"] = _pair(cls_name, config, "patch_size")
    # transformers reads an explicit head_dim when config.json has one, else hidden // heads.
    head_dim = config.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise config_error(cls_name, "head_dim", head_dim, "a positive integer")
    c["head_dim"] = head_dim
    pooler = config.get("pooler_output_size")
    if pooler is not None and (isinstance(pooler, bool) or not isinstance(pooler, int)):
        raise config_error(cls_name, "pooler_output_size", pooler, "null or a positive integer")
    c["pooler_output_size"] = pooler or c["hidden_size"]  # ViTConfig: a falsy value is hidden
    (h, w), (ph, pw) = c["image_size"], c["patch_size"]
    if h < ph or w < pw:
        raise config_error(
            cls_name, "patch_size", config.get("patch_size", 16), f"at most image_size {(h, w)}"
        )
    c["num_patches"] = (h // ph) * (w // pw)
    return c


class ViTPatchEmbeddings(Module):
    """The patches' linear embedding: a convolution with stride equal to its kernel."""

    projection: nn.Conv2d

    def __call__(self, pixel_values: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, channels, height, width)` to `(batch, patches, hidden)` (`key`:
        `projection`'s, for LoRA dropout)."""
        x = self.projection(pixel_values, key=key)
        b, d = x.shape[:2]
        return jnp.swapaxes(x.reshape(b, d, -1), 1, 2)


@axis_names({"cls_token": (None, None, "embed"), "position_embeddings": (None, None, "embed")})
class ViTEmbeddings(Module):
    """The CLS token, the patch embeddings and the learned position embeddings."""

    cls_token: Array
    patch_embeddings: ViTPatchEmbeddings
    position_embeddings: Array
    dropout: nn.Dropout
    image_size: tuple[int, int] = field(static=True)

    def __call__(
        self, pixel_values: Array, *, resize: bool = False, key: PRNGKeyArray | None = None
    ) -> Array:
        """`(batch, channels, height, width)` to `(batch, 1 + patches, hidden)`; with `resize`
        the patch positions resized to the image's grid (PyTorch's bicubic kernel, as
        `transformers`' `interpolate_pos_encoding`)."""
        table = self.position_embeddings
        height, width = pixel_values.shape[2:]
        x = self.patch_embeddings(pixel_values, key=projection_keys(key, 1)[0])
        if resize and not (x.shape[1] == table.shape[1] - 1 and height == width):
            patch = unwrapped(self.patch_embeddings.projection).kernel_size[0]
            resized = resize_grid(table[0, 1:], (height // patch, width // patch))
            table = jnp.concatenate([table[:, :1], resized[None]], axis=1)
        cls = jnp.broadcast_to(self.cls_token.astype(x.dtype), (x.shape[0], 1, x.shape[2]))
        x = jnp.concatenate([cls, x], axis=1) + table.astype(x.dtype)
        return self.dropout(x, key=key)


@axis_names({**attention_in("q_proj", "k_proj", "v_proj"), **attention_out("o_proj")})
class ViTAttention(Module):
    """Self-attention with separate q, k, v and output projections."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    o_proj: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        b, s, _ = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        *keys, k_out = projection_keys(key, 4)
        q, k, v = (
            p(x, key=pk).reshape(b, s, self.num_heads, -1)
            for p, pk in zip(projections, keys, strict=True)
        )
        out = attend_encoder(q, k, v, bias, self.dropout, key=key)
        return self.o_proj(out.reshape(b, s, -1), key=k_out)


@axis_names(mlp_out("fc2"))
class ViTMLP(Module):
    """`fc2(act(fc1(x)))`."""

    fc1: nn.Linear
    fc2: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The feed-forward block (`key`: the projections', for LoRA dropout)."""
        k1, k2 = projection_keys(key, 2)
        return self.fc2(get_activation(self.act)(self.fc1(x, key=k1)), key=k2)


class ViTLayer(Module):
    """One pre-norm encoder layer."""

    attention: ViTAttention
    layernorm_before: nn.LayerNorm
    layernorm_after: nn.LayerNorm
    mlp: ViTMLP
    dropout: nn.Dropout

    def __call__(self, x: Array, bias: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        k1, k2, k3 = split_key(key, 3)
        (k_mlp,) = projection_keys(key, 1)
        x = x + self.dropout(self.attention(self.layernorm_before(x), bias, key=k1), key=k2)
        return x + self.dropout(self.mlp(self.layernorm_after(x), key=k_mlp), key=k3)


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> ViTLayer:
    hidden, inner = c["hidden_size"], c["num_attention_heads"] * c["head_dim"]
    ks = jax.random.split(key, 6)

    def qkv(k: PRNGKeyArray) -> nn.Linear:
        return nn.Linear(hidden, inner, use_bias=c["qkv_bias"], dtype=dtype, key=k)

    def norm() -> nn.LayerNorm:
        return nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)

    attention = ViTAttention(
        q_proj=qkv(ks[0]),
        k_proj=qkv(ks[1]),
        v_proj=qkv(ks[2]),
        o_proj=nn.Linear(inner, hidden, dtype=dtype, key=ks[3]),
        dropout=nn.Dropout(c["attention_probs_dropout_prob"], inference=True),
        num_heads=c["num_attention_heads"],
    )
    mlp = ViTMLP(
        fc1=nn.Linear(hidden, c["intermediate_size"], dtype=dtype, key=ks[4]),
        fc2=nn.Linear(c["intermediate_size"], hidden, dtype=dtype, key=ks[5]),
        act=c["hidden_act"],
    )
    dropout = nn.Dropout(c["hidden_dropout_prob"], inference=True)
    return ViTLayer(attention, norm(), norm(), mlp, dropout)


def _build(
    c: dict[str, Any], key: PRNGKeyArray, dtype: Any, add_pooler: bool
) -> tuple[ViTEmbeddings, nn.Stack, nn.LayerNorm, BertPooler | None]:
    hidden = c["hidden_size"]
    k_cls, k_patch, k_pos, k_layers, k_pool = jax.random.split(key, 5)
    dtype_ = jnp.zeros((), dtype if dtype is not None else jnp.float32).dtype
    embeddings = ViTEmbeddings(
        cls_token=jax.random.normal(k_cls, (1, 1, hidden), dtype_),
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
        position_embeddings=jax.random.normal(k_pos, (1, c["num_patches"] + 1, hidden), dtype_),
        dropout=nn.Dropout(c["hidden_dropout_prob"], inference=True),
        image_size=c["image_size"],
    )
    layers = nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=k_layers)
    pooler = None
    if add_pooler:
        dense = nn.Linear(hidden, c["pooler_output_size"], dtype=dtype, key=k_pool)
        pooler = BertPooler(dense=dense, act=c["pooler_act"])
    layernorm = nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)
    return embeddings, layers, layernorm, pooler


# `transformers` 5's conversion mapping for ViT (its files keep ViT's old module names).
VIT_LOAD_RENAMES: tuple[tuple[str, str], ...] = (
    (r"encoder\.layer\.", "layers."),
    (r"attention\.query", "q_proj"),
    (r"attention\.key", "k_proj"),
    (r"attention\.value", "v_proj"),
    (r"attention\.output\.dense", "attention.o_proj"),
    (r"intermediate\.dense", "mlp.fc1"),
    (r"output\.dense", "mlp.fc2"),
)
VIT_SAVE_RENAMES: tuple[tuple[str, str], ...] = (
    (r"mlp\.fc2", "output.dense"),
    (r"mlp\.fc1", "intermediate.dense"),
    (r"attention\.o_proj", "attention.output.dense"),
    (r"v_proj", "attention.value"),
    (r"k_proj", "attention.key"),
    (r"q_proj", "attention.query"),
    (r"(^|\.)layers\.", r"\1encoder.layer."),
)


@register_architecture
class ViTModel(PretrainedModel):
    """The Vision Transformer (`transformers.ViTModel`, with its pooler): `last_hidden_state`.

    Call it with `pixel_values` `(batch, num_channels, height, width)` of the config's
    `image_size` (and optionally an `attention_mask` `(batch, 1 + patches)`), or of other sizes
    with `interpolate_pos_encoding=True`: the position embeddings are resized as `transformers`
    resizes them (PyTorch's bicubic kernel).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import ViTModel
        >>> config = {"hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        ...           "intermediate_size": 32, "image_size": 8, "patch_size": 4}
        >>> model = ViTModel.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((1, 3, 8, 8))).shape   # CLS + 4 patches
        (1, 5, 16)
    """

    architecture = "ViTModel"
    model_type = "vit"
    load_renames = VIT_LOAD_RENAMES
    save_renames = VIT_SAVE_RENAMES
    base_model_prefix = "vit"

    embeddings: ViTEmbeddings
    layers: nn.Stack
    layernorm: nn.LayerNorm
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
        """Build the model with random weights from a `ViTConfig` dict.

        Arguments:
            config: the config; keys it lacks take `ViTConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).
            add_pooling_layer: build the pooler (`transformers`' argument of the same name).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        parts = _build(_read(cls.__name__, config), key, dtype, add_pooling_layer)
        return cls(config, *parts)

    def __call__(
        self,
        *,
        pixel_values: Any,
        attention_mask: Any = None,
        interpolate_pos_encoding: bool | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`last_hidden_state` `(batch, 1 + patches, hidden)`.

        Arguments:
            pixel_values: `(batch, num_channels, height, width)`, cast to the parameters' dtype.
            attention_mask: optional `(batch, 1 + patches)`, 1 to attend, 0 to mask.
            interpolate_pos_encoding: `True` for other image sizes (an int `patch_size` and a
                square grid of positions in the config, as `transformers` needs).
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`.
        """
        name = type(self).__name__
        projection = unwrapped(self.embeddings.patch_embeddings.projection)
        x = jnp.asarray(pixel_values).astype(projection.weight.dtype)
        channels = projection.in_channels
        size = self.embeddings.image_size
        if x.ndim != 4 or x.shape[1] != channels:
            raise ValueError(
                f"{name}: pixel_values has shape {x.shape}; expected (batch, {channels}, "
                f"{size[0]}, {size[1]}) (num_channels and image_size of the config)."
            )
        if interpolate_pos_encoding:
            self._check_resize(name, x.shape[2:])
        elif x.shape[2:] != size:
            raise ValueError(
                f"{name}: pixel_values has shape {x.shape}; expected (batch, {channels}, "
                f"{size[0]}, {size[1]}) (num_channels and image_size of the config), or "
                "interpolate_pos_encoding=True."
            )
        k_emb, k_layers = split_key(key, 2)
        x = self.embeddings(x, resize=bool(interpolate_pos_encoding), key=k_emb)
        bias = attention_bias(attention_mask, (x.shape[0], x.shape[1]), x.dtype)
        return self.layernorm(self.layers(x, bias, key=k_layers))

    def _check_resize(self, name: str, image: tuple[int, ...]) -> None:
        """Refuse by name what `transformers`' `interpolate_pos_encoding` cannot compute."""
        patch = self.config.get("patch_size", _VALUES["patch_size"].default)
        positions = self.embeddings.position_embeddings.shape[1] - 1
        side = int(positions**0.5)
        if isinstance(patch, tuple) or side * side != positions:
            raise ValueError(
                f"{name}: interpolate_pos_encoding needs an int patch_size (got {patch!r}) and a "
                f"square grid of position embeddings (got {positions}), as transformers does."
            )
        if min(image) < patch:
            raise ValueError(f"{name}: pixel_values {image} are smaller than one patch.")


@register_architecture
class ViTForImageClassification(PretrainedModel):
    """ViT with a linear classifier on the CLS token (`transformers.ViTForImageClassification`).

    Returns `logits` `(batch, num_labels)`; with `num_labels` 0 the classifier is the identity,
    as in `transformers`. Called as `ViTModel` is.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models import ViTForImageClassification
        >>> config = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        ...           "intermediate_size": 32, "image_size": 8, "patch_size": 4,
        ...           "num_labels": 10}
        >>> model = ViTForImageClassification.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((2, 3, 8, 8))).shape
        (2, 10)
    """

    architecture = "ViTForImageClassification"
    model_type = "vit"
    load_renames = VIT_LOAD_RENAMES
    save_renames = VIT_SAVE_RENAMES
    base_model_prefix = "vit"

    vit: ViTModel
    classifier: nn.Linear | nn.Identity

    @classmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: Any = None,
    ) -> Self:
        """Build the model with random weights from a `ViTConfig` dict (see `ViTModel`)."""
        config = PretrainedConfig(config)
        labels = num_labels(cls.__name__, config)
        k_vit, k_cls = jax.random.split(key)
        parts = _build(_read(cls.__name__, config), k_vit, dtype, add_pooler=False)
        vit = ViTModel(config, *parts)
        hidden = vit.layernorm.shape[0]
        classifier: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            classifier = nn.Linear(hidden, labels, dtype=dtype, key=k_cls)
        return cls(config=config, vit=vit, classifier=classifier)

    def __call__(
        self,
        *,
        pixel_values: Any,
        attention_mask: Any = None,
        interpolate_pos_encoding: bool | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """The `logits` `(batch, num_labels)`; arguments as `ViTModel`'s."""
        hidden = self.vit(
            pixel_values=pixel_values,
            attention_mask=attention_mask,
            interpolate_pos_encoding=interpolate_pos_encoding,
            key=key,
        )
        # The body takes `key` itself: the classifier's key comes from another stream.
        out: Array = self.classifier(hidden[:, 0], key=projection_keys(key, 1, stream=1)[0])
        return out
