# exports: CLIPModel, CLIPTextModel, CLIPVisionModel, CLIPTextModelWithProjection, CLIPVisionModelWithProjection, CLIPForImageClassification  # noqa: E501
"""CLIP: `CLIPModel`, its text and vision towers (with and without projection) and
`CLIPForImageClassification`, with `transformers`' names.

Implemented in `_clip.py` (the towers) and `_clip_model.py` (shared with SigLIP:
`_clip_layers.py`).
"""

from treemod.models._clip import (
    CLIPTextModel,
    CLIPTextModelWithProjection,
    CLIPVisionModel,
    CLIPVisionModelWithProjection,
)
from treemod.models._clip_model import CLIPForImageClassification, CLIPModel

__all__ = [
    "CLIPModel",
    "CLIPTextModel",
    "CLIPVisionModel",
    "CLIPTextModelWithProjection",
    "CLIPVisionModelWithProjection",
    "CLIPForImageClassification",
]
