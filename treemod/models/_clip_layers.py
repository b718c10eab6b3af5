"""What CLIP and SigLIP share: the encoder layer, the text embeddings and the config readers.

Both towers of both families run the same pre-norm layer (`self_attn.{q,k,v,out}_proj`,
`layer_norm1`, `mlp.fc1`/`fc2`, `layer_norm2`) in an `encoder.layers` stack; the text towers
embed tokens and learned positions alike. `_clip.py` and `_siglip.py` hold the rest.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import PRNGKeyArray

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._sharding.axes import axis_names

from ._attention_parts import (
    attend,
    causal_mask,
    projection_keys,
    split_key,
    token_inputs,
    unwrapped,
)
from ._axis_layouts import attention_in, attention_out, mlp_out, positions
from ._base import PretrainedConfig, PretrainedModel, config_error
from ._config_values import Value, read_config
from ._hf_activations import get_activation, hf_activation
from ._vit_interpolate import resize_grid

__all__ = [
    "CLIPEncoder",
    "VisionTower",
    "check_pixels",
    "patch_positions",
    "param_dtype",
    "CLIPTextEmbeddings",
    "encoder",
    "read_tower",
    "sub_config",
    "text_embeddings",
    "text_hidden",
]


def read_tower(
    cls_name: str, config: Mapping[str, Any], values: Mapping[str, Value], where: str = ""
) -> dict[str, Any]:
    """One tower's config values, checked (keys named `where.key` in messages when nested)."""
    c = read_config(cls_name + (f" ({where})" if where else ""), config, values)
    owner = cls_name + (f" ({where})" if where else "")
    hf_activation(owner, "hidden_act", c["hidden_act"])
    if c["hidden_size"] % c["num_attention_heads"]:
        raise config_error(
            owner,
            "num_attention_heads",
            c["num_attention_heads"],
            f"a divisor of hidden_size {c['hidden_size']}",
        )
    for key in ("image_size", "patch_size"):
        if key in values:
            value = c[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise config_error(owner, key, value, "a positive integer")
    if "patch_size" in values and c["patch_size"] > c["image_size"]:
        raise config_error(owner, "patch_size", c["patch_size"], "at most image_size")
    return c


def sub_config(config: PretrainedConfig, key: str) -> PretrainedConfig:
    """A composite config's `text_config` / `vision_config` (empty: the defaults)."""
    sub = config.get(key)
    return sub if isinstance(sub, PretrainedConfig) else PretrainedConfig({})


@axis_names({**attention_in("q_proj", "k_proj", "v_proj"), **attention_out("out_proj")})
class CLIPAttention(Module):
    """Self-attention with q, k, v and output projections (biases on all)."""

    q_proj: nn.Linear
    k_proj: nn.Linear
    v_proj: nn.Linear
    out_proj: nn.Linear
    dropout: nn.Dropout
    num_heads: int = field(static=True)

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None) -> Array:
        """`(batch, seq, hidden)` to the same shape; `mask` boolean, True to attend."""
        b, s, _ = x.shape
        *keys, k_out = projection_keys(key, 4)
        q, k, v = (
            p(x, key=pk).reshape(b, s, self.num_heads, -1)
            for p, pk in zip((self.q_proj, self.k_proj, self.v_proj), keys, strict=True)
        )
        scale = q.shape[-1] ** -0.5
        out = attend(q, k, v, mask, scale=scale, dropout=self.dropout, key=key, scores="input")
        return self.out_proj(out.reshape(b, s, -1), key=k_out)


@axis_names(mlp_out("fc2"))
class CLIPMLP(Module):
    """`fc2(act(fc1(x)))`."""

    fc1: nn.Linear
    fc2: nn.Linear
    act: str = field(static=True)

    def __call__(self, x: Array, *, key: PRNGKeyArray | None = None) -> Array:
        """The feed-forward block (`key`: the projections', for LoRA dropout)."""
        k1, k2 = projection_keys(key, 2)
        return self.fc2(get_activation(self.act)(self.fc1(x, key=k1)), key=k2)


class CLIPEncoderLayer(Module):
    """One pre-norm layer: attention and MLP, each with a residual."""

    self_attn: CLIPAttention
    layer_norm1: nn.LayerNorm
    mlp: CLIPMLP
    layer_norm2: nn.LayerNorm

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` to the same shape."""
        x = x + self.self_attn(self.layer_norm1(x), mask, key=key)
        # The attention draws its projections' keys from `key` itself: the MLP another stream.
        (k_mlp,) = projection_keys(key, 1, stream=1)
        return x + self.mlp(self.layer_norm2(x), key=k_mlp)


class CLIPEncoder(Module):
    """The layers (`encoder.layers.{i}`)."""

    layers: nn.Stack

    def __call__(self, x: Array, mask: Array | None, *, key: PRNGKeyArray | None = None) -> Array:
        """`(batch, seq, hidden)` through every layer."""
        out: Array = self.layers(x, mask, key=key)
        return out


def mlp(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> CLIPMLP:
    """The tower's MLP block (`hidden -> intermediate -> hidden`)."""
    k1, k2 = jax.random.split(key)
    hidden, inner = c["hidden_size"], c["intermediate_size"]
    return CLIPMLP(
        nn.Linear(hidden, inner, dtype=dtype, key=k1),
        nn.Linear(inner, hidden, dtype=dtype, key=k2),
        c["hidden_act"],
    )


def _layer(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> CLIPEncoderLayer:
    hidden = c["hidden_size"]
    ks = jax.random.split(key, 5)
    q, k, v, o = (nn.Linear(hidden, hidden, dtype=dtype, key=k) for k in ks[:4])
    dropout = nn.Dropout(c["attention_dropout"], inference=True)
    attention = CLIPAttention(q, k, v, o, dropout, c["num_attention_heads"])
    norm1 = nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)
    norm2 = nn.LayerNorm(hidden, eps=c["layer_norm_eps"], dtype=dtype)
    return CLIPEncoderLayer(attention, norm1, mlp(c, dtype, ks[4]), norm2)


def encoder(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> CLIPEncoder:
    """The tower's `num_hidden_layers` layers."""
    return CLIPEncoder(nn.Stack(lambda k: _layer(c, dtype, k), c["num_hidden_layers"], key=key))


@axis_names(positions("position_embedding"))
class CLIPTextEmbeddings(Module):
    """Token and learned position embeddings, summed."""

    token_embedding: nn.Embedding
    position_embedding: nn.Embedding


def text_embeddings(c: dict[str, Any], dtype: Any, key: PRNGKeyArray) -> CLIPTextEmbeddings:
    """The text tower's embeddings."""
    k1, k2 = jax.random.split(key)
    hidden = c["hidden_size"]
    return CLIPTextEmbeddings(
        nn.Embedding(c["vocab_size"], hidden, dtype=dtype, key=k1),
        nn.Embedding(c["max_position_embeddings"], hidden, dtype=dtype, key=k2),
    )


def text_hidden(
    owner: str,
    embeddings: CLIPTextEmbeddings,
    layers: CLIPEncoder,
    final_layer_norm: nn.LayerNorm,
    inputs: tuple[Any, Any, Any],
    *,
    causal: bool,
    key: PRNGKeyArray | None,
) -> tuple[Array, Array]:
    """A text tower's `(last_hidden_state, input_ids)`: embeddings, the layers under a causal
    (CLIP) or bidirectional (SigLIP) mask with the padding removed, the final norm."""
    ids, mask, positions = token_inputs(owner, *inputs)
    seq, table = ids.shape[1], embeddings.position_embedding.weight
    if seq > table.shape[0]:
        raise ValueError(
            f"{owner}: sequence length {seq} is above max_position_embeddings {table.shape[0]}."
        )
    if positions is None:
        positions = jnp.arange(seq)[None]
    x = embeddings.token_embedding(ids) + embeddings.position_embedding(positions)
    full: Array | None = None if mask is None else mask[:, None, None, :]
    if causal:
        full = causal_mask(seq, mask)
    k_layers = split_key(key, 1)[0]
    return final_layer_norm(layers(x, full, key=k_layers)), ids


def param_dtype(dtype: Any) -> Any:
    """The parameters' dtype for `dtype=` (None: float32)."""
    return jnp.zeros((), dtype if dtype is not None else jnp.float32).dtype


def check_pixels(owner: str, conv: nn.Conv2d, size: int, pixel_values: Any, resize: Any) -> Array:
    """`pixel_values` as an array of the parameters' dtype, `(batch, num_channels, image_size,
    image_size)`; any size of at least one patch with `interpolate_pos_encoding` (`resize`)."""
    conv = unwrapped(conv)
    x = jnp.asarray(pixel_values).astype(conv.weight.dtype)
    patch = conv.kernel_size[0]
    shape_ok = x.ndim == 4 and x.shape[1] == conv.in_channels
    if shape_ok and resize:
        shape_ok = min(x.shape[2:]) >= patch
    elif shape_ok:
        shape_ok = x.shape[2:] == (size, size)
    if not shape_ok:
        raise ValueError(
            f"{owner}: pixel_values has shape {x.shape}; expected (batch, {conv.in_channels}, "
            f"{size}, {size}) (num_channels and image_size of the config), or any size of at "
            f"least one patch ({patch}) with interpolate_pos_encoding=True."
        )
    return x


def patch_positions(owner: str, table: Array, patch: int, height: int, width: int) -> Array:
    """The patches' position embeddings `(patches, hidden)` for a `height x width` image: the
    table `(positions, hidden)` itself at its own square grid, else resized as `transformers`'
    `interpolate_pos_encoding` resizes it (PyTorch's bicubic kernel)."""
    grid, n = (height // patch, width // patch), table.shape[0]
    if grid[0] * grid[1] == n and height == width:
        return table
    side = int(n**0.5)
    if side * side != n:
        raise ValueError(f"{owner}: {n} position embeddings do not make a square grid to resize.")
    return resize_grid(table, grid)


class VisionTower(PretrainedModel):
    """The call of CLIP's and SigLIP's vision towers: the pixels checked against the config's
    `image_size`, the patches embedded (`embeddings(owner, pixels, key=...)`), then the
    family's `encode`. A tower declares `vision_values` (its config values, for the default
    `image_size`) and the fields `embeddings`, and implements `encode`."""

    vision_values: ClassVar[Mapping[str, Value]]

    def __call__(
        self,
        *,
        pixel_values: Any,
        interpolate_pos_encoding: bool | None = None,
        key: PRNGKeyArray | None = None,
    ) -> Array:
        """`last_hidden_state` `(batch, patches, hidden)` (CLIP: `1 + patches`, before
        `post_layernorm`; SigLIP: after it).

        Arguments:
            pixel_values: `(batch, num_channels, image_size, image_size)`.
            interpolate_pos_encoding: `True` for other image sizes (the position embeddings
                resized as `transformers` resizes them, with PyTorch's bicubic kernel).
            key: PRNG key for dropout (used only after `tm.nn.inference_mode(model, False)`).

        Returns:
            `last_hidden_state`.
        """
        owner = type(self).__name__
        size = self.config.get("image_size", self.vision_values["image_size"].default)
        embeddings = getattr(self, "embeddings")  # noqa: B009 (a subclass's field)
        resize = interpolate_pos_encoding
        x = check_pixels(owner, embeddings.patch_embedding, size, pixel_values, resize)
        return self.encode(embeddings(owner, x, key=projection_keys(key, 1)[0]), key=key)

    @abc.abstractmethod
    def encode(self, x: Array, *, key: PRNGKeyArray | None) -> Array:
        """The layers (and their norms) over the embedded patches `(batch, seq, hidden)`."""
