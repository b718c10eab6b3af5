"""Hugging Face's activation functions by their config names (`transformers.activations.ACT2FN`).

Configs name the activation (`activation_function` in GPT-2, `hidden_act` in Llama): each name
maps to the same formula `transformers` computes. Names whose module holds parameters (`prelu`,
`xielu`: their weights would be extra tensors in the checkpoint) and unknown names are refused
through `config_error`, naming the model class and the config key.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import Array, lax

from treemod.models._base import config_error

__all__ = ["ACTIVATIONS", "get_activation", "hf_activation"]

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _gelu_erf(x: Array) -> Array:
    return x * 0.5 * (1.0 + lax.erf(x / math.sqrt(2.0)))


def _gelu_tanh(x: Array) -> Array:
    # NewGELU / GELUTanh / AccurateGELU: one formula (PyTorch's approximate="tanh" computes it too).
    return 0.5 * x * (1.0 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x**3)))


def _gelu_fast(x: Array) -> Array:
    return 0.5 * x * (1.0 + jnp.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


def _laplace(x: Array, mu: float = 0.707107, sigma: float = 0.282095) -> Array:
    return 0.5 * (1.0 + lax.erf((x - mu) / (sigma * math.sqrt(2.0))))


def _relu6(x: Array) -> Array:
    return jnp.clip(x, 0.0, 6.0)


ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "gelu": _gelu_erf,
    "gelu_10": lambda x: jnp.clip(_gelu_erf(x), -10.0, 10.0),
    "gelu_fast": _gelu_fast,
    "gelu_new": _gelu_tanh,
    "gelu_python": _gelu_erf,
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_python_tanh": _gelu_tanh,
    "gelu_accurate": _gelu_tanh,
    "hardswish": lambda x: x * _relu6(x + 3.0) / 6.0,
    "laplace": _laplace,
    "leaky_relu": lambda x: jnp.where(x >= 0, x, 0.01 * x),
    "linear": lambda x: x,
    "mish": lambda x: x * jnp.tanh(jax.nn.softplus(x)),
    "quick_gelu": lambda x: x * jax.nn.sigmoid(1.702 * x),
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "relu6": _relu6,
    "sigmoid": jax.nn.sigmoid,
    "silu": jax.nn.silu,
    "sqrtsoftplus": lambda x: jnp.sqrt(jax.nn.softplus(x)),
    "swish": jax.nn.silu,
    "tanh": jnp.tanh,
}
"""Every parameter-free activation of `transformers.activations.ACT2FN`, by name."""

_WITH_PARAMETERS = ("prelu", "xielu")


def hf_activation(model_cls_name: str, key: str, name: object) -> Callable[[Array], Array]:
    """The activation `transformers` builds for the config value `name`.

    Arguments:
        model_cls_name: the model class, for the error message.
        key: the config key that names it (`"activation_function"`, `"hidden_act"`).
        name: the config value.

    Returns:
        The function, elementwise on any array.

    Raises:
        CheckpointError: `name` is not one of `ACTIVATIONS` (an activation with parameters, or
            one `transformers` does not know either).

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod.models._hf_activations import hf_activation
        >>> hf_activation("GPT2Model", "activation_function", "relu")(jnp.array([-1.0, 2.0]))
        Array([0., 2.], dtype=float32)
    """
    if isinstance(name, str) and name in ACTIVATIONS:
        return ACTIVATIONS[name]
    supported = ", ".join(sorted(ACTIVATIONS))
    if name in _WITH_PARAMETERS:
        supported += f" ({name!r} holds its own parameters, which treemod does not implement)"
    raise config_error(model_cls_name, key, name, supported)


def get_activation(name: str) -> Callable[[Array], Array]:
    """The activation named `name` (one of `ACTIVATIONS`), for a name already checked.

    Arguments:
        name: an `ACTIVATIONS` key (check config values with `hf_activation` when building).

    Returns:
        The function.

    Example:
        >>> import jax.numpy as jnp
        >>> from treemod.models._hf_activations import get_activation
        >>> get_activation("tanh")(jnp.array([0.0]))
        Array([0.], dtype=float32)
    """
    return ACTIVATIONS[name]
