# exports: WhisperModel, WhisperForConditionalGeneration, WhisperForAudioClassification
"""Whisper: `WhisperModel`, `WhisperForConditionalGeneration` and their layers (implemented in
`_whisper.py` and `_whisper_layers.py`); `generate_seq2seq` decodes with
`WhisperForConditionalGeneration`; `log_mel_features` computes its input features from audio.

Attribute paths are `transformers`' parameter names
(`model.encoder.layers.{i}.self_attn.q_proj.weight`).
"""

from treemod.models._generate_seq2seq import generate_seq2seq
from treemod.models._whisper import (
    WHISPER_VALUES,
    WhisperForConditionalGeneration,
    WhisperModel,
)
from treemod.models._whisper_features import log_mel_features, mel_filters
from treemod.models._whisper_heads import WhisperForAudioClassification
from treemod.models._whisper_layers import (
    WhisperAttention,
    WhisperDecoder,
    WhisperDecoderLayer,
    WhisperEncoder,
    WhisperEncoderLayer,
)

__all__ = [
    "WHISPER_VALUES",
    "WhisperAttention",
    "WhisperDecoder",
    "WhisperDecoderLayer",
    "WhisperEncoder",
    "WhisperEncoderLayer",
    "WhisperForAudioClassification",
    "WhisperForConditionalGeneration",
    "WhisperModel",
    "generate_seq2seq",
    "log_mel_features",
    "mel_filters",
]
