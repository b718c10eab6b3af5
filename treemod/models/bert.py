# exports: BertModel, BertForMaskedLM, BertForSequenceClassification
"""BERT: `BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`.

Implemented in `_bert.py` (shared parts with ViT and ResNet: `_bert_layers.py`).
"""

from treemod.models._bert import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
)

__all__ = [
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
]
