# exports: MPNetModel, MPNetForMaskedLM, MPNetForSequenceClassification, MPNetForTokenClassification  # noqa: E501
"""MPNet: `MPNetModel`, `MPNetForMaskedLM`, `MPNetForSequenceClassification`,
`MPNetForTokenClassification`.

Implemented in `_mpnet.py` (shared parts: `_bert_layers.py`; the heads' mechanism:
`_bert_heads.py`).
"""

from treemod.models._mpnet import (
    MPNetForMaskedLM,
    MPNetForSequenceClassification,
    MPNetForTokenClassification,
    MPNetModel,
)

__all__ = [
    "MPNetModel",
    "MPNetForMaskedLM",
    "MPNetForSequenceClassification",
    "MPNetForTokenClassification",
]
