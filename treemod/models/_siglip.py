"""SigLIP: `SiglipModel`, `SiglipTextModel`, `SiglipVisionModel`, `SiglipForImageClassification`.

SigLIP's encoder layers and text embeddings are CLIP's (`_clip_layers.py`); what differs is
here. The text tower is bidirectional (padding masked), normalised, and pools its last position
through a linear `head`. The vision tower has no class token (a convolution with a bias, one
position per patch), normalises its last hidden state (`post_layernorm`) and pools it with a
multihead attention pooling `head`: a learned probe attends over the patches
(`torch.nn.MultiheadAttention`'s `in_proj_weight`, `in_proj_bias`, `out_proj`), then a residual
MLP. `SiglipModel` scores cosine similarities by `exp(logit_scale)` plus `logit_bias`.
"""

# exports: SiglipModel, SiglipTextModel, SiglipVisionModel, SiglipForImageClassification

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

from ._attention_parts import attend, projection_keys, split_key, unwrapped
from ._axis_layouts import attention_out, positions
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._clip_layers import (
    CLIPMLP,
    CLIPEncoder,
    CLIPTextEmbeddings,
    VisionTower,
    encoder,
    mlp,
    param_dtype,
    patch_positions,
    read_tower,
    sub_config,
    text_embeddings,
    text_hidden,
)
from ._clip_model import normalised
from ._config_values import Value, num_labels

__all__ = ["SiglipModel", "SiglipTextModel", "SiglipVisionModel", "SiglipForImageClassification"]

# The values the towers read, with `SiglipTextConfig`'s and `SiglipVisionConfig`'s defaults.
TEXT_VALUES: dict[str, Value] = {
    "vocab_size": Value(32000, "size"),
    "hidden_size": Value(768, "size"),
    "intermediate_size": Value(3072, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "max_position_embeddings": Value(64, "size"),
    "hidden_act": Value("gelu_pytorch_tanh"),
    "layer_norm_eps": Value(1e-6, "positive"),
    "attention_dropout": Value(0.0, "dropout"),
    "projection_size": Value(None, "size", nullable=True),  # None: hidden_size
}
VISION_VALUES: dict[str, Value] = {
    "hidden_size": Value(768, "size"),
    "intermediate_size": Value(3072, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "num_channels": Value(3, "size"),
    "image_size": Value(224),
    "patch_size": Value(16),
    "hidden_act": Value("gelu_pytorch_tanh"),
    "layer_norm_eps": Value(1e-6, "positive"),
    "attention_dropout": Value(0.0, "dropout"),
    "vision_use_head": Value(True, "bool"),
}
_IGNORED = ("position_ids",)  # old files' buffers (transformers' `(^|\.)position_ids$`)


@register_architecture
class SiglipTextModel(PretrainedModel):
    """SigLIP's text tower (`transformers.SiglipTextModel`): returns `last_hidden_state`.

    Bidirectional self-attention over `input_ids` `(batch, seq)`; an `attention_mask` removes
    padded keys. `pooler_output` gives `head(last_hidden_state[:, -1])`, the last position's
    (SigLIP pads to a fixed length on the right).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.siglip import SiglipTextModel
        >>> config = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        ...           "num_hidden_layers": 1, "num_attention_heads": 2}
        >>> model = SiglipTextModel.from_config(config, key=jax.random.key(0))
        >>> ids = jnp.array([[3, 4, 9]])
        >>> model(input_ids=ids).shape, model.pooler_output(input_ids=ids).shape
        ((1, 3, 8), (1, 8))
    """

    architecture = "SiglipTextModel"
    model_type = "siglip_text_model"
    keys_to_ignore_on_load_unexpected = _IGNORED

    embeddings: CLIPTextEmbeddings
    encoder: CLIPEncoder
    final_layer_norm: nn.LayerNorm
    head: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `SiglipTextConfig` dict.

        Arguments:
            config: the config; keys it lacks take `SiglipTextConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        return cls._build(config, read_tower(cls.__name__, config, TEXT_VALUES), key, dtype)

    @classmethod
    def _build(cls, config: PretrainedConfig, c: dict[str, Any], key: Any, dtype: Any) -> Self:
        k1, k2, k3 = jax.random.split(key, 3)
        hidden = c["hidden_size"]
        norm = nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)
        head = nn.Linear(hidden, c["projection_size"] or hidden, dtype=dtype, key=k3)
        return cls(config, text_embeddings(c, dtype, k1), encoder(c, dtype, k2), norm, head)

    def __call__(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`last_hidden_state` `(batch, seq, hidden)`.

        Arguments:
            input_ids: token ids `(batch, seq)`.
            attention_mask: `(batch, seq)`, 1 for tokens, 0 for padding.
            position_ids: `(batch, seq)` or `(1, seq)` (default `0..seq-1`).
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`.
        """
        inputs = (input_ids, attention_mask, position_ids)
        name = type(self).__name__
        parts = (self.embeddings, self.encoder, self.final_layer_norm)
        return text_hidden(name, *parts, inputs, causal=False, key=key)[0]

    def pooler_output(self, **inputs: Any) -> Array:
        """`transformers`' `pooler_output` `(batch, projection_size)`; `__call__`'s arguments."""
        # The tower takes the key itself: the head's comes from another stream.
        return self.head(
            self(**inputs)[:, -1], key=projection_keys(inputs.get("key"), 1, stream=1)[0]
        )


@axis_names(positions("position_embedding"))
class SiglipVisionEmbeddings(Module):
    """The patches (a convolution with a bias) and one learned position per patch."""

    patch_embedding: nn.Conv2d
    position_embedding: nn.Embedding

    def __call__(self, owner: str, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, channels, height, width)` to `(batch, patches, hidden)` (`key`: the patch
        convolution's, for LoRA dropout)."""
        patch = unwrapped(self.patch_embedding).kernel_size[0]
        table = self.position_embedding.weight
        table = patch_positions(owner, table, patch, x.shape[2], x.shape[3])
        patches = self.patch_embedding(x, key=key)
        b, d = patches.shape[:2]
        patches = jnp.swapaxes(patches.reshape(b, d, -1), 1, 2)
        return patches + table.astype(patches.dtype)[None]


@axis_names(
    {"in_proj_weight": ("heads", "embed"), "in_proj_bias": ("heads",), **attention_out("out_proj")}
)
class SiglipPoolingAttention(Module):
    """`torch.nn.MultiheadAttention`'s parameters and its computation (no mask, no dropout)."""

    in_proj_weight: Array
    in_proj_bias: Array
    out_proj: nn.Linear
    num_heads: int = field(static=True)

    def __call__(self, query: Array, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`query` `(batch, 1, hidden)` attending over `x` `(batch, seq, hidden)` (`key`:
        `out_proj`'s, for LoRA dropout; the input projection is one array, not a layer)."""
        w, b = self.in_proj_weight.astype(x.dtype), self.in_proj_bias.astype(x.dtype)
        wq, wk, wv = jnp.split(w, 3)
        bq, bk, bv = jnp.split(b, 3)

        def heads(y: Array, weight: Array, bias: Array) -> Array:
            out = y @ weight.T + bias[None, None]
            return out.reshape(*out.shape[:2], self.num_heads, -1)

        q, k, v = heads(query, wq, bq), heads(x, wk, bk), heads(x, wv, bv)
        # torch's scores are in the inputs' dtype; "input" also keeps bfloat16 off the
        # jax.nn.dot_product_attention path, which refuses it under strict dtype promotion.
        out = attend(q, k, v, None, scale=q.shape[-1] ** -0.5, scores="input")
        return self.out_proj(out.reshape(*out.shape[:2], -1), key=key)


@axis_names({"probe": (None, None, "embed")})
class SiglipMultiheadAttentionPoolingHead(Module):
    """A learned probe attends over the patches; then a residual MLP on its normalised output."""

    probe: Array
    attention: SiglipPoolingAttention
    layernorm: nn.LayerNorm
    mlp: CLIPMLP

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, patches, hidden)` to `(batch, hidden)` (`key`: the projections', for LoRA
        dropout)."""
        k_attention, k_mlp = projection_keys(key, 2)
        probe = jnp.broadcast_to(self.probe.astype(x.dtype), (x.shape[0], 1, x.shape[2]))
        h = self.attention(probe, x, key=k_attention)
        return (h + self.mlp(self.layernorm(h), key=k_mlp))[:, 0]


@register_architecture
class SiglipVisionModel(VisionTower):
    """SigLIP's vision tower (`transformers.SiglipVisionModel`): returns `last_hidden_state`
    (normalised by `post_layernorm`).

    Call it with `pixel_values` `(batch, num_channels, image_size, image_size)`, or other sizes
    with `interpolate_pos_encoding=True` (PyTorch's bicubic resize of the positions, as
    `transformers`). `pooler_output` gives the attention pooling head's output (with
    `vision_use_head`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.siglip import SiglipVisionModel
        >>> config = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "image_size": 8, "patch_size": 4}
        >>> model = SiglipVisionModel.from_config(config, key=jax.random.key(0))
        >>> x = jnp.ones((1, 3, 8, 8))
        >>> model(pixel_values=x).shape, model.pooler_output(pixel_values=x).shape
        ((1, 4, 8), (1, 8))
    """

    architecture = "SiglipVisionModel"
    vision_values = VISION_VALUES
    model_type = "siglip_vision_model"
    keys_to_ignore_on_load_unexpected = _IGNORED

    embeddings: SiglipVisionEmbeddings
    encoder: CLIPEncoder
    post_layernorm: nn.LayerNorm
    head: SiglipMultiheadAttentionPoolingHead | None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `SiglipVisionConfig` dict (see
        `SiglipTextModel.from_config`)."""
        config = PretrainedConfig(config)
        return cls._build(config, read_tower(cls.__name__, config, VISION_VALUES), key, dtype)

    @classmethod
    def _build(cls, config: PretrainedConfig, c: dict[str, Any], key: Any, dtype: Any) -> Self:
        hidden, patch = c["hidden_size"], c["patch_size"]
        ks = jax.random.split(key, 7)
        conv = nn.Conv2d(c["num_channels"], hidden, patch, stride=patch, dtype=dtype, key=ks[0])
        positions = nn.Embedding((c["image_size"] // patch) ** 2, hidden, dtype=dtype, key=ks[1])

        def norm() -> nn.LayerNorm:
            return nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)

        head = None
        if c["vision_use_head"]:
            attention = SiglipPoolingAttention(
                jax.random.normal(ks[3], (3 * hidden, hidden), param_dtype(dtype)) * hidden**-0.5,
                jnp.zeros((3 * hidden,), param_dtype(dtype)),
                nn.Linear(hidden, hidden, dtype=dtype, key=ks[4]),
                c["num_attention_heads"],
            )
            probe = jax.random.normal(ks[5], (1, 1, hidden), param_dtype(dtype))
            head = SiglipMultiheadAttentionPoolingHead(
                probe, attention, norm(), mlp(c, dtype, ks[6])
            )
        embeddings = SiglipVisionEmbeddings(conv, positions)
        return cls(config, embeddings, encoder(c, dtype, ks[2]), norm(), head)

    def encode(self, x: Array, *, key: PRNGKeyArray | None) -> Array:
        """The layers, then `post_layernorm` (the call is `VisionTower`'s)."""
        return self.post_layernorm(self.encoder(x, None, key=key))

    def pooler_output(self, **inputs: Any) -> Array:
        """`transformers`' `pooler_output` `(batch, hidden)`; `__call__`'s arguments."""
        if self.head is None:
            raise ValueError(
                f"{type(self).__name__}: the config has vision_use_head false, so there is no "
                "pooler_output (transformers returns None)."
            )
        # The tower takes the key itself: the head's keys come from another stream.
        return self.head(self(**inputs), key=projection_keys(inputs.get("key"), 1, stream=1)[0])


@register_architecture
class SiglipModel(PretrainedModel):
    """SigLIP (`transformers.SiglipModel`): returns `logits_per_image` `(images, texts)`.

    Called as `CLIPModel` is; `logits` gives `(logits_per_image, logits_per_text)`:
    `cos(text, image) * exp(logit_scale) + logit_bias`. `get_text_features` and
    `get_image_features` give the towers' `pooler_output`s.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.siglip import SiglipModel
        >>> tower = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        ...          "num_attention_heads": 2}
        >>> config = {"text_config": {**tower, "vocab_size": 10},
        ...           "vision_config": {**tower, "image_size": 8, "patch_size": 4}}
        >>> model = SiglipModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[3, 9], [4, 9], [5, 9]]),
        ...       pixel_values=jnp.ones((2, 3, 8, 8))).shape
        (2, 3)
    """

    architecture = "SiglipModel"
    model_type = "siglip"
    keys_to_ignore_on_load_unexpected = _IGNORED

    text_model: SiglipTextModel
    vision_model: SiglipVisionModel
    logit_scale: Array
    logit_bias: Array

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `SiglipConfig` dict (its `text_config`
        and `vision_config` take their classes' defaults for the keys they lack)."""
        config = PretrainedConfig(config)
        name = cls.__name__
        text_config = sub_config(config, "text_config")
        vision_config = sub_config(config, "vision_config")
        tc = read_tower(name, text_config, TEXT_VALUES, "text_config")
        vc = read_tower(name, vision_config, VISION_VALUES, "vision_config")
        if not vc["vision_use_head"]:
            # transformers' SiglipModel scores the pooled image embeddings the head gives.
            raise config_error(name, "vision_config.vision_use_head", False, "true")
        if (tc["projection_size"] or tc["hidden_size"]) != vc["hidden_size"]:
            raise config_error(
                name,
                "text_config.projection_size",
                tc["projection_size"],
                f"the vision tower's hidden_size {vc['hidden_size']} (the embeddings are compared)",
            )
        ks = jax.random.split(key, 3)
        return cls(
            config,
            SiglipTextModel._build(text_config, tc, ks[0], dtype),
            SiglipVisionModel._build(vision_config, vc, ks[1], dtype),
            *jax.random.normal(ks[2], (2, 1), param_dtype(dtype)),
        )

    def get_text_features(self, **inputs: Any) -> Array:
        """The text embeddings `(texts, projection_size)`; `SiglipTextModel`'s inputs."""
        return self.text_model.pooler_output(**inputs)

    def get_image_features(self, **inputs: Any) -> Array:
        """The image embeddings `(images, hidden)`; `SiglipVisionModel`'s inputs."""
        return self.vision_model.pooler_output(**inputs)

    def logits(
        self,
        *,
        input_ids: Any,
        pixel_values: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        interpolate_pos_encoding: bool | None = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, Array]:
        """`(logits_per_image, logits_per_text)`, `(images, texts)` and its transpose."""
        k_text, k_image = split_key(key, 2)
        text = self.get_text_features(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            key=k_text,
        )
        image = self.get_image_features(
            pixel_values=pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            key=k_image,
        )
        scores = normalised(text) @ normalised(image).T
        # (1,) parameters, as transformers keeps them
        scale, bias = jnp.exp(self.logit_scale)[None], self.logit_bias[None]
        per_text = scores * scale + bias
        return per_text.T, per_text

    def __call__(self, **inputs: Any) -> Array:
        """`logits_per_image` `(images, texts)`; the arguments are `logits`'."""
        return self.logits(**inputs)[0]


@register_architecture
class SiglipForImageClassification(PretrainedModel):
    """SigLIP's vision tower with a linear classifier on the mean of its normalised last hidden
    state (`transformers.SiglipForImageClassification`): `logits` `(batch, num_labels)`, from a
    `SiglipConfig` (its `vision_config`). Called as `SiglipVisionModel` is."""

    architecture = "SiglipForImageClassification"
    model_type = "siglip"
    base_model_prefix = "vision_model"
    keys_to_ignore_on_load_unexpected = _IGNORED

    vision_model: SiglipVisionModel
    classifier: nn.Linear | nn.Identity

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `SiglipConfig` dict."""
        config = PretrainedConfig(config)
        labels = num_labels(cls.__name__, config)
        vision_config = sub_config(config, "vision_config")
        vc = read_tower(cls.__name__, vision_config, VISION_VALUES, "vision_config")
        k1, k2 = jax.random.split(key)
        classifier: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            classifier = nn.Linear(vc["hidden_size"], labels, dtype=dtype, key=k2)
        return cls(config, SiglipVisionModel._build(vision_config, vc, k1, dtype), classifier)

    def __call__(self, **inputs: Any) -> Array:
        """The `logits`; `SiglipVisionModel`'s arguments."""
        pooled = self.vision_model(**inputs).mean(axis=1)
        # The tower takes the key itself: the classifier's comes from another stream.
        out: Array = self.classifier(pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0])
        return out
