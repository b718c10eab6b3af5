# exports: SiglipModel, SiglipTextModel, SiglipVisionModel, SiglipForImageClassification
"""SigLIP: `SiglipModel`, `SiglipTextModel`, `SiglipVisionModel` (with its attention pooling
head), `SiglipForImageClassification`, with `transformers`' names.

Implemented in `_siglip.py` (what it shares with CLIP: `_clip_layers.py`).
"""

from treemod.models._siglip import (
    SiglipForImageClassification,
    SiglipModel,
    SiglipTextModel,
    SiglipVisionModel,
)

__all__ = [
    "SiglipModel",
    "SiglipTextModel",
    "SiglipVisionModel",
    "SiglipForImageClassification",
]
