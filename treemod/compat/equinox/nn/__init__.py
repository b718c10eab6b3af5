"""Equinox's `equinox.nn` over treemod: `eqx.nn` after `import treemod.compat.equinox as eqx`.

Every layer is a compat class over treemod's (an instance of treemod's layer counts as an
instance of it): with Equinox's signature, initialisation (draws in the parameter dtype) and call
convention where they differ, and without shape checks, for the class and its subclasses.
"""

from treemod.nn import KeySeq, init, split_like

from ._activations import PReLU
from ._attention import MultiheadAttention
from ._batch_norm import BatchNorm
from ._conv import (
    Conv,
    Conv1d,
    Conv2d,
    Conv3d,
    ConvTranspose,
    ConvTranspose1d,
    ConvTranspose2d,
    ConvTranspose3d,
)
from ._embedding import Embedding, RotaryPositionalEmbedding
from ._inference import inference_mode
from ._linear import Dropout, Linear
from ._mlp import MLP
from ._normalisation import GroupNorm, LayerNorm, RMSNorm
from ._pool import (
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AdaptivePool,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
    Pool,
)
from ._rnn import GRUCell, LSTMCell
from ._sequential import Lambda, Sequential
from ._spectral_norm import SpectralNorm
from ._stateful import State, StatefulLayer, StateIndex, delete_init_state, make_with_state
from ._treemod_layers import (
    AdaptiveAvgPool,
    AdaptiveMaxPool,
    AvgPool,
    Identity,
    MaxPool,
    Shared,
    Stack,
    WeightNorm,
)

__all__ = [
    "AdaptiveAvgPool",
    "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d",
    "AdaptiveAvgPool3d",
    "AdaptiveMaxPool",
    "AdaptiveMaxPool1d",
    "AdaptiveMaxPool2d",
    "AdaptiveMaxPool3d",
    "AdaptivePool",
    "AvgPool",
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "Conv",
    "Conv1d",
    "Conv2d",
    "Conv3d",
    "ConvTranspose",
    "ConvTranspose1d",
    "ConvTranspose2d",
    "ConvTranspose3d",
    "Dropout",
    "Embedding",
    "GRUCell",
    "GroupNorm",
    "Identity",
    "KeySeq",
    "LSTMCell",
    "Lambda",
    "LayerNorm",
    "Linear",
    "MLP",
    "MaxPool",
    "MaxPool1d",
    "MaxPool2d",
    "MaxPool3d",
    "MultiheadAttention",
    "PReLU",
    "Pool",
    "RMSNorm",
    "RotaryPositionalEmbedding",
    "Sequential",
    "Shared",
    "SpectralNorm",
    "Stack",
    "WeightNorm",
    "init",
    "split_like",
    "BatchNorm",
    "inference_mode",
    # Equinox's state API.
    "State",
    "StateIndex",
    "StatefulLayer",
    "delete_init_state",
    "make_with_state",
]
