# exports: Wav2Vec2Model, Wav2Vec2ForCTC, Wav2Vec2ForSequenceClassification
"""wav2vec2: `Wav2Vec2Model`, `Wav2Vec2ForCTC`, `Wav2Vec2ForSequenceClassification`.

Implemented in `_wav2vec2.py` (its parts: `_wav2vec2_layers.py`).
"""

from treemod.models._wav2vec2 import (
    Wav2Vec2ForCTC,
    Wav2Vec2ForSequenceClassification,
    Wav2Vec2Model,
)

__all__ = ["Wav2Vec2Model", "Wav2Vec2ForCTC", "Wav2Vec2ForSequenceClassification"]
