"""treemod.nn: layers, initialisers and containers.

Each section below belongs to one area; keep names sorted within a section and list every
name in `__all__`.
"""

# Layers, initialisers, containers, Stack.

# BatchNorm and inference mode.
from ._batch_norm import BatchNorm
from ._inference import inference_mode

__all__: list[str] = [
    # Layers, initialisers, containers, Stack.
    # BatchNorm and inference mode.
    "BatchNorm",
    "inference_mode",
]
