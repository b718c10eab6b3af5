# exports: XLMRobertaModel, XLMRobertaForMaskedLM, XLMRobertaForSequenceClassification, XLMRobertaForTokenClassification  # noqa: E501
"""XLM-RoBERTa: `XLMRobertaModel`, `XLMRobertaForMaskedLM`,
`XLMRobertaForSequenceClassification`, `XLMRobertaForTokenClassification`.

Implemented in `_xlm_roberta.py`, RoBERTa's classes (`_roberta.py`) under XLM-RoBERTa's names.
"""

from treemod.models._xlm_roberta import (
    XLMRobertaForMaskedLM,
    XLMRobertaForSequenceClassification,
    XLMRobertaForTokenClassification,
    XLMRobertaModel,
)

__all__ = [
    "XLMRobertaModel",
    "XLMRobertaForMaskedLM",
    "XLMRobertaForSequenceClassification",
    "XLMRobertaForTokenClassification",
]
