"""treemod.nn: layers, initialisers and containers.

Each section below belongs to one area; keep names sorted within a section and list every
name in `__all__`.
"""

# Layers, initialisers, containers, Stack.
from . import init
from ._activations import PReLU
from ._adaptive_pool import (
    AdaptiveAvgPool,
    AdaptiveAvgPool1d,
    AdaptiveAvgPool2d,
    AdaptiveAvgPool3d,
    AdaptiveMaxPool,
    AdaptiveMaxPool1d,
    AdaptiveMaxPool2d,
    AdaptiveMaxPool3d,
    AdaptivePool,
)
from ._attention import MultiheadAttention
from ._conv import Conv, Conv1d, Conv2d, Conv3d
from ._conv_transpose import ConvTranspose, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from ._dropout import Dropout
from ._embedding import Embedding
from ._keys import KeySeq, split_like
from ._linear import Identity, Linear
from ._mlp import MLP
from ._normalisation import GroupNorm, LayerNorm, RMSNorm
from ._pool import (
    AvgPool,
    AvgPool1d,
    AvgPool2d,
    AvgPool3d,
    MaxPool,
    MaxPool1d,
    MaxPool2d,
    MaxPool3d,
)
from ._pool_base import Pool
from ._rnn import GRUCell, LSTMCell
from ._rotary import RotaryPositionalEmbedding
from ._sequential import Lambda, Sequential
from ._shared import Shared
from ._spectral_norm import SpectralNorm
from ._stack import Stack
from ._weight_norm import WeightNorm

# isort: split

# BatchNorm and inference mode.
from ._batch_norm import BatchNorm
from ._inference import inference_mode

__all__: list[str] = [
    # Layers, initialisers, containers, Stack.
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
    # BatchNorm and inference mode.
    "BatchNorm",
    "inference_mode",
]
