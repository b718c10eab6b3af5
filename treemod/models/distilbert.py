# exports: DistilBertModel, DistilBertForMaskedLM, DistilBertForSequenceClassification, DistilBertForTokenClassification  # noqa: E501
"""DistilBERT: `DistilBertModel`, `DistilBertForMaskedLM`, `DistilBertForSequenceClassification`,
`DistilBertForTokenClassification`.

Implemented in `_distilbert.py` (the heads' mechanism: `_bert_heads.py`).
"""

from treemod.models._distilbert import (
    DistilBertForMaskedLM,
    DistilBertForSequenceClassification,
    DistilBertForTokenClassification,
    DistilBertModel,
)

__all__ = [
    "DistilBertModel",
    "DistilBertForMaskedLM",
    "DistilBertForSequenceClassification",
    "DistilBertForTokenClassification",
]
