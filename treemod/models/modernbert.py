# exports: ModernBertModel, ModernBertForMaskedLM, ModernBertForSequenceClassification,
# ModernBertForTokenClassification
"""ModernBERT: `ModernBertModel`, `ModernBertForMaskedLM`, `ModernBertForSequenceClassification`,
`ModernBertForTokenClassification`.

Implemented in `_modernbert.py` (its parts: `_modernbert_layers.py`).
"""

from treemod.models._modernbert import (
    ModernBertForMaskedLM,
    ModernBertForSequenceClassification,
    ModernBertForTokenClassification,
    ModernBertModel,
)

__all__ = [
    "ModernBertModel",
    "ModernBertForMaskedLM",
    "ModernBertForSequenceClassification",
    "ModernBertForTokenClassification",
]
