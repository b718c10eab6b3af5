# exports: T5Model, T5ForConditionalGeneration, T5EncoderModel, T5ForSequenceClassification, T5ForTokenClassification  # noqa: E501
"""T5: `T5Model`, `T5ForConditionalGeneration`, `T5EncoderModel`, the classification heads and
their layers (implemented in `_t5.py`, `_t5_heads.py` and `_t5_layers.py`); `generate_seq2seq`
decodes with `T5ForConditionalGeneration`.

Attribute paths are `transformers`' parameter names
(`encoder.block.{i}.layer.0.SelfAttention.q.weight`).
"""

from treemod.models._generate_seq2seq import generate_seq2seq
from treemod.models._seq2seq_parts import Seq2SeqLM
from treemod.models._t5 import T5_VALUES, T5EncoderModel, T5ForConditionalGeneration, T5Model
from treemod.models._t5_heads import (
    T5ClassificationHead,
    T5ForSequenceClassification,
    T5ForTokenClassification,
)
from treemod.models._t5_layers import T5Attention, T5Block, T5Stack

__all__ = [
    "T5_VALUES",
    "Seq2SeqLM",
    "T5Attention",
    "T5ClassificationHead",
    "T5Block",
    "T5EncoderModel",
    "T5ForConditionalGeneration",
    "T5ForSequenceClassification",
    "T5ForTokenClassification",
    "T5Model",
    "T5Stack",
    "generate_seq2seq",
]
