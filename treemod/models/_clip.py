"""CLIP's towers: `CLIPTextModel`, `CLIPVisionModel`, and with their projections
`CLIPTextModelWithProjection`, `CLIPVisionModelWithProjection` (`_clip_model.py`: `CLIPModel`).

The text tower is causal and pools the hidden state of its end-of-sequence token as
`transformers` 5 finds it: the first `eos_token_id` of each row, or, with the old configs'
`eos_token_id` 2, the row's largest token id. The vision tower prepends a class embedding, runs
a pre-norm (`pre_layrnorm`, `transformers`' spelling) and pools the normalised class token.
`CLIPModel` scores normalised projections by `exp(logit_scale)`. Old files' `position_ids`
buffers are skipped as `transformers` skips them; a tower's old files (`vision_model.` in front
of each name) load as its `transformers` 5 class reads them.
"""

# exports: CLIPTextModel, CLIPVisionModel, CLIPTextModelWithProjection, CLIPVisionModelWithProjection  # noqa: E501

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

from ._attention_parts import projection_keys, unwrapped
from ._axis_layouts import positions
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._clip_layers import (
    CLIPEncoder,
    CLIPTextEmbeddings,
    VisionTower,
    encoder,
    param_dtype,
    patch_positions,
    read_tower,
    text_embeddings,
    text_hidden,
)
from ._config_values import Value

__all__ = [
    "CLIPTextModel",
    "CLIPVisionModel",
    "CLIPTextModelWithProjection",
    "CLIPVisionModelWithProjection",
]

# The values the towers read, with `CLIPTextConfig`'s and `CLIPVisionConfig`'s defaults.
TEXT_VALUES: dict[str, Value] = {
    "vocab_size": Value(49408, "size"),
    "hidden_size": Value(512, "size"),
    "intermediate_size": Value(2048, "size"),
    "projection_dim": Value(512, "size", nullable=True),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(8, "size"),
    "max_position_embeddings": Value(77, "size"),
    "hidden_act": Value("quick_gelu"),
    "layer_norm_eps": Value(1e-5, "positive"),
    "attention_dropout": Value(0.0, "dropout"),
    "eos_token_id": Value(49407, "count"),
}
VISION_VALUES: dict[str, Value] = {
    "hidden_size": Value(768, "size"),
    "intermediate_size": Value(3072, "size"),
    "projection_dim": Value(512, "size"),
    "num_hidden_layers": Value(12, "size"),
    "num_attention_heads": Value(12, "size"),
    "num_channels": Value(3, "size"),
    "image_size": Value(224),
    "patch_size": Value(32),
    "hidden_act": Value("quick_gelu"),
    "layer_norm_eps": Value(1e-5, "positive"),
    "attention_dropout": Value(0.0, "dropout"),
}
IGNORED = ("position_ids",)  # old files' buffers (transformers' `(^|\.)position_ids$`)


@axis_names({"class_embedding": ("embed",), **positions("position_embedding")})
class CLIPVisionEmbeddings(Module):
    """The class embedding, the patches (a bias-free convolution), learned positions."""

    class_embedding: Array
    patch_embedding: nn.Conv2d
    position_embedding: nn.Embedding

    def __call__(self, owner: str, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, channels, height, width)` to `(batch, 1 + patches, hidden)` (`key`: the
        patch convolution's, for LoRA dropout)."""
        table = self.position_embedding.weight
        patch = unwrapped(self.patch_embedding).kernel_size[0]
        table = jnp.concatenate(
            [table[:1], patch_positions(owner, table[1:], patch, x.shape[2], x.shape[3])]
        )
        patches = self.patch_embedding(x, key=key)
        b, d = patches.shape[:2]
        patches = jnp.swapaxes(patches.reshape(b, d, -1), 1, 2)
        cls = jnp.broadcast_to(self.class_embedding.astype(patches.dtype), (b, 1, d))
        x = jnp.concatenate([cls, patches], axis=1)
        return x + table.astype(x.dtype)[None]


def read_text(cls_name: str, config: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """A `CLIPTextConfig`'s values, checked (`where`: its key in a composite config)."""
    return read_tower(cls_name, config, TEXT_VALUES, where)


def read_vision(cls_name: str, config: Mapping[str, Any], where: str = "") -> dict[str, Any]:
    """A `CLIPVisionConfig`'s values, checked (`where`: its key in a composite config)."""
    return read_tower(cls_name, config, VISION_VALUES, where)


@register_architecture
class CLIPTextModel(PretrainedModel):
    """CLIP's text tower (`transformers.CLIPTextModel`): returns `last_hidden_state`.

    Causal self-attention over `input_ids` `(batch, seq)`; an `attention_mask` removes padded
    keys. `pooler_output` gives the end-of-sequence token's hidden state.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.clip import CLIPTextModel
        >>> config = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
        ...           "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": 9}
        >>> model = CLIPTextModel.from_config(config, key=jax.random.key(0))
        >>> ids = jnp.array([[3, 4, 9]])
        >>> model(input_ids=ids).shape, model.pooler_output(input_ids=ids).shape
        ((1, 3, 8), (1, 8))
    """

    architecture = "CLIPTextModel"
    model_type = "clip_text_model"
    keys_to_ignore_on_load_unexpected = IGNORED

    embeddings: CLIPTextEmbeddings
    encoder: CLIPEncoder
    final_layer_norm: nn.LayerNorm

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPTextConfig` dict.

        Arguments:
            config: the config; keys it lacks take `CLIPTextConfig`'s defaults.
            key: the PRNG key.
            dtype: the parameters' dtype (default float32).

        Returns:
            The model, in inference mode.
        """
        config = PretrainedConfig(config)
        return cls._build(config, read_text(cls.__name__, config), key, dtype)

    @classmethod
    def _build(cls, config: PretrainedConfig, c: dict[str, Any], key: Any, dtype: Any) -> Self:
        k1, k2 = jax.random.split(key)
        norm = nn.LayerNorm(c["hidden_size"], eps=c["layer_norm_eps"], dtype=dtype)
        return cls(config, text_embeddings(c, dtype, k1), encoder(c, dtype, k2), norm)

    def outputs(
        self,
        *,
        input_ids: Any,
        attention_mask: Any = None,
        position_ids: Any = None,
        key: PRNGKeyArray | None = None,
    ) -> tuple[Array, Array]:
        """`(last_hidden_state, pooler_output)`; the arguments are `__call__`'s."""
        inputs = (input_ids, attention_mask, position_ids)
        hidden, ids = text_hidden(
            type(self).__name__,
            self.embeddings,
            self.encoder,
            self.final_layer_norm,
            inputs,
            causal=True,
            key=key,
        )
        eos = self.config.get("eos_token_id", TEXT_VALUES["eos_token_id"].default)
        # transformers 5: configs from before the eos fix (eos_token_id 2) take the largest id.
        where = jnp.argmax(ids, axis=-1) if eos == 2 else jnp.argmax(ids == eos, axis=-1)
        return hidden, hidden[jnp.arange(hidden.shape[0]), where]

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
        return self.outputs(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, key=key
        )[0]

    def pooler_output(self, **inputs: Any) -> Array:
        """`transformers`' `pooler_output` `(batch, hidden)`; `__call__`'s arguments."""
        return self.outputs(**inputs)[1]


@register_architecture
class CLIPVisionModel(VisionTower):
    """CLIP's vision tower (`transformers.CLIPVisionModel`): returns `last_hidden_state`.

    Call it with `pixel_values` `(batch, num_channels, image_size, image_size)`, or other sizes
    with `interpolate_pos_encoding=True` (PyTorch's bicubic resize of the positions, as
    `transformers`). `pooler_output` gives the class token through `post_layernorm`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.clip import CLIPVisionModel
        >>> config = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        ...           "num_attention_heads": 2, "image_size": 8, "patch_size": 4}
        >>> model = CLIPVisionModel.from_config(config, key=jax.random.key(0))
        >>> model(pixel_values=jnp.ones((1, 3, 8, 8))).shape
        (1, 5, 8)
    """

    architecture = "CLIPVisionModel"
    vision_values = VISION_VALUES
    model_type = "clip_vision_model"
    keys_to_ignore_on_load_unexpected = IGNORED

    embeddings: CLIPVisionEmbeddings
    pre_layrnorm: nn.LayerNorm
    encoder: CLIPEncoder
    post_layernorm: nn.LayerNorm

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPVisionConfig` dict (see
        `CLIPTextModel.from_config`)."""
        config = PretrainedConfig(config)
        return cls._build(config, read_vision(cls.__name__, config), key, dtype)

    @classmethod
    def _build(cls, config: PretrainedConfig, c: dict[str, Any], key: Any, dtype: Any) -> Self:
        hidden, patch = c["hidden_size"], c["patch_size"]
        ks = jax.random.split(key, 4)
        positions = (c["image_size"] // patch) ** 2 + 1
        embeddings = CLIPVisionEmbeddings(
            jax.random.normal(ks[0], (hidden,), param_dtype(dtype)),
            nn.Conv2d(
                c["num_channels"],
                hidden,
                patch,
                stride=patch,
                use_bias=False,
                dtype=dtype,
                key=ks[1],
            ),
            nn.Embedding(positions, hidden, dtype=dtype, key=ks[2]),
        )

        def norm() -> nn.LayerNorm:
            return nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)

        return cls(config, embeddings, norm(), encoder(c, dtype, ks[3]), norm())

    def encode(self, x: Array, *, key: PRNGKeyArray | None) -> Array:
        """`pre_layrnorm`, then the layers (the call is `VisionTower`'s)."""
        return self.encoder(self.pre_layrnorm(x), None, key=key)

    def pooler_output(self, **inputs: Any) -> Array:
        """`transformers`' `pooler_output` `(batch, hidden)`; `__call__`'s arguments."""
        return self.post_layernorm(self(**inputs)[:, 0])


def _projection(n_in: int, n_out: Any, owner: str, dtype: Any, key: PRNGKeyArray) -> nn.Linear:
    if n_out is None:
        raise config_error(owner, "projection_dim", None, "a positive integer")
    return nn.Linear(n_in, n_out, use_bias=False, dtype=dtype, key=key)


@register_architecture
class CLIPTextModelWithProjection(PretrainedModel):
    """CLIP's text tower and its projection (`transformers.CLIPTextModelWithProjection`):
    returns `text_embeds` `(batch, projection_dim)` (not normalised). Called as
    `CLIPTextModel` is."""

    architecture = "CLIPTextModelWithProjection"
    model_type = "clip_text_model"
    base_model_prefix = "text_model"
    keys_to_ignore_on_load_unexpected = IGNORED

    text_model: CLIPTextModel
    text_projection: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPTextConfig` dict."""
        config = PretrainedConfig(config)
        c = read_text(cls.__name__, config)
        k1, k2 = jax.random.split(key)
        text = CLIPTextModel._build(config, c, k1, dtype)
        proj = _projection(c["hidden_size"], c["projection_dim"], cls.__name__, dtype, k2)
        return cls(config, text, proj)

    def __call__(self, **inputs: Any) -> Array:
        """`text_embeds`; `CLIPTextModel`'s arguments."""
        # The tower takes the key itself: the projection's comes from another stream.
        pooled = self.text_model.pooler_output(**inputs)
        return self.text_projection(pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0])


@register_architecture
class CLIPVisionModelWithProjection(PretrainedModel):
    """CLIP's vision tower and its projection (`transformers.CLIPVisionModelWithProjection`):
    returns `image_embeds` `(batch, projection_dim)` (not normalised). Called as
    `CLIPVisionModel` is."""

    architecture = "CLIPVisionModelWithProjection"
    model_type = "clip_vision_model"
    base_model_prefix = "vision_model"
    keys_to_ignore_on_load_unexpected = IGNORED

    vision_model: CLIPVisionModel
    visual_projection: nn.Linear

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPVisionConfig` dict."""
        config = PretrainedConfig(config)
        c = read_vision(cls.__name__, config)
        k1, k2 = jax.random.split(key)
        vision = CLIPVisionModel._build(config, c, k1, dtype)
        proj = _projection(c["hidden_size"], c["projection_dim"], cls.__name__, dtype, k2)
        return cls(config, vision, proj)

    def __call__(self, **inputs: Any) -> Array:
        """`image_embeds`; `CLIPVisionModel`'s arguments."""
        # The tower takes the key itself: the projection's comes from another stream.
        pooled = self.vision_model.pooler_output(**inputs)
        return self.visual_projection(
            pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0]
        )
