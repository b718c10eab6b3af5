# exports: RobertaModel, RobertaForMaskedLM, RobertaForSequenceClassification, RobertaForTokenClassification  # noqa: E501
"""RoBERTa: `RobertaModel`, `RobertaForMaskedLM`, `RobertaForSequenceClassification`,
`RobertaForTokenClassification`.

Implemented in `_roberta.py` over BERT's (`_bert.py`); XLM-RoBERTa is `xlm_roberta.py`.
"""

from treemod.models._roberta import (
    RobertaForMaskedLM,
    RobertaForSequenceClassification,
    RobertaForTokenClassification,
    RobertaModel,
)

__all__ = [
    "RobertaModel",
    "RobertaForMaskedLM",
    "RobertaForSequenceClassification",
    "RobertaForTokenClassification",
]
