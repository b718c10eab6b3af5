# exports: BertModel, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification
"""BERT: `BertModel`, `BertForMaskedLM`, `BertForSequenceClassification`,
`BertForTokenClassification`.

Implemented in `_bert.py` (shared parts with its variants, ViT and ResNet: `_bert_layers.py`;
the heads' mechanism: `_bert_heads.py`).
"""

from treemod.models._bert import (
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

__all__ = [
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForTokenClassification",
]
