"""CLIP's two-tower model and its image classifier: `CLIPModel`, `CLIPForImageClassification`.

`CLIPModel` scores the cosine similarity of the projected text and image embeddings, scaled by
`exp(logit_scale)`; the towers are `_clip.py`'s.
"""

# exports: CLIPModel, CLIPForImageClassification

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn

from ._attention_parts import projection_keys, split_key
from ._base import PretrainedConfig, PretrainedModel, config_error, register_architecture
from ._clip import IGNORED, CLIPTextModel, CLIPVisionModel, read_text, read_vision
from ._clip_layers import param_dtype, sub_config
from ._config_values import Value, num_labels, read_config

__all__ = ["CLIPModel", "CLIPForImageClassification", "normalised"]

_VALUES: dict[str, Value] = {
    "projection_dim": Value(512, "size"),
    "logit_scale_init_value": Value(2.6592),  # the initial logit_scale: a number
}


def normalised(x: Array) -> Array:
    """`x` over its L2 norm along the last axis."""
    out: Array = x / jnp.linalg.norm(x, axis=-1, keepdims=True)
    return out


@register_architecture
class CLIPModel(PretrainedModel):
    """CLIP (`transformers.CLIPModel`): returns `logits_per_image` `(images, texts)`.

    Call it with `input_ids` (and `attention_mask`, `position_ids`) for the texts and
    `pixel_values` for the images. `logits` gives `(logits_per_image, logits_per_text)`;
    `get_text_features` and `get_image_features` the projected (unnormalised) embeddings.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from treemod.models.clip import CLIPModel
        >>> tower = {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1,
        ...          "num_attention_heads": 2}
        >>> config = {"text_config": {**tower, "vocab_size": 10, "eos_token_id": 9},
        ...           "vision_config": {**tower, "image_size": 8, "patch_size": 4},
        ...           "projection_dim": 4}
        >>> model = CLIPModel.from_config(config, key=jax.random.key(0))
        >>> model(input_ids=jnp.array([[3, 9], [4, 9], [5, 9]]),
        ...       pixel_values=jnp.ones((2, 3, 8, 8))).shape
        (2, 3)
    """

    architecture = "CLIPModel"
    model_type = "clip"
    keys_to_ignore_on_load_unexpected = IGNORED

    text_model: CLIPTextModel
    vision_model: CLIPVisionModel
    visual_projection: nn.Linear
    text_projection: nn.Linear
    logit_scale: Array

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPConfig` dict (its `text_config` and
        `vision_config` take their classes' defaults for the keys they lack)."""
        config = PretrainedConfig(config)
        name = cls.__name__
        c = read_tower_top(name, config)
        text_config, vision_config = (
            sub_config(config, "text_config"),
            sub_config(config, "vision_config"),
        )
        tc = read_text(name, text_config, "text_config")
        vc = read_vision(name, vision_config, "vision_config")
        ks = jax.random.split(key, 4)
        proj = c["projection_dim"]
        return cls(
            config,
            CLIPTextModel._build(text_config, tc, ks[0], dtype),
            CLIPVisionModel._build(vision_config, vc, ks[1], dtype),
            nn.Linear(vc["hidden_size"], proj, use_bias=False, dtype=dtype, key=ks[2]),
            nn.Linear(tc["hidden_size"], proj, use_bias=False, dtype=dtype, key=ks[3]),
            jnp.asarray(c["logit_scale_init_value"], param_dtype(dtype)),
        )

    def get_text_features(self, **inputs: Any) -> Array:
        """The projected text embeddings `(texts, projection_dim)`; `CLIPTextModel`'s inputs."""
        # The tower takes the key itself: the projection's comes from another stream.
        pooled = self.text_model.pooler_output(**inputs)
        return self.text_projection(pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0])

    def get_image_features(self, **inputs: Any) -> Array:
        """The projected image embeddings `(images, projection_dim)`; `CLIPVisionModel`'s."""
        # The tower takes the key itself: the projection's comes from another stream.
        pooled = self.vision_model.pooler_output(**inputs)
        return self.visual_projection(
            pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0]
        )

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
        """`(logits_per_image, logits_per_text)`: the cosine similarities times
        `exp(logit_scale)`, `(images, texts)` and its transpose."""
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
        per_text = normalised(text) @ normalised(image).T * jnp.exp(self.logit_scale)
        return per_text.T, per_text

    def __call__(self, **inputs: Any) -> Array:
        """`logits_per_image` `(images, texts)`; the arguments are `logits`'."""
        return self.logits(**inputs)[0]


def read_tower_top(name: str, config: PretrainedConfig) -> dict[str, Any]:
    """`CLIPConfig`'s own values (`projection_dim`, `logit_scale_init_value`), checked."""
    c = read_config(name, config, _VALUES)
    scale = c["logit_scale_init_value"]
    if isinstance(scale, bool) or not isinstance(scale, int | float):
        raise config_error(name, "logit_scale_init_value", scale, "a number")
    return c


@register_architecture
class CLIPForImageClassification(PretrainedModel):
    """CLIP's vision tower with a linear classifier on the mean of the patch tokens
    (`transformers.CLIPForImageClassification`): `logits` `(batch, num_labels)`, from a
    `CLIPConfig` (its `vision_config`). Called as `CLIPVisionModel` is."""

    architecture = "CLIPForImageClassification"
    model_type = "clip"
    base_model_prefix = "vision_model"
    keys_to_ignore_on_load_unexpected = IGNORED

    vision_model: CLIPVisionModel
    classifier: nn.Linear | nn.Identity

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any] | PretrainedConfig, *, key: PRNGKeyArray, dtype: Any = None
    ) -> Self:
        """Build the model with random weights from a `CLIPConfig` dict."""
        config = PretrainedConfig(config)
        labels = num_labels(cls.__name__, config)
        vision_config = sub_config(config, "vision_config")
        vc = read_vision(cls.__name__, vision_config, "vision_config")
        k1, k2 = jax.random.split(key)
        classifier: nn.Linear | nn.Identity = nn.Identity()
        if labels > 0:
            classifier = nn.Linear(vc["hidden_size"], labels, dtype=dtype, key=k2)
        return cls(config, CLIPVisionModel._build(vision_config, vc, k1, dtype), classifier)

    def __call__(self, **inputs: Any) -> Array:
        """The `logits`; `CLIPVisionModel`'s arguments."""
        pooled = self.vision_model(**inputs)[:, 1:].mean(axis=1)
        # The tower takes the key itself: the classifier's comes from another stream.
        out: Array = self.classifier(pooled, key=projection_keys(inputs.get("key"), 1, stream=1)[0])
        return out
