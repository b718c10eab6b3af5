"""treemod.nn: layers, initialisers and containers.

Each section below belongs to one area; keep names sorted within a section and list every
name in `__all__`.
"""

# Layers, initialisers, containers, Stack.

# BatchNorm and inference mode.

__all__: list[str] = [
    # Layers, initialisers, containers, Stack.
    # BatchNorm and inference mode.
]
