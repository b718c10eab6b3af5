# exports: DebertaV2Model, DebertaV2ForMaskedLM, DebertaV2ForSequenceClassification,
# DebertaV2ForTokenClassification
"""DeBERTa-v2 (and v3): `DebertaV2Model`, `DebertaV2ForMaskedLM`,
`DebertaV2ForSequenceClassification`, `DebertaV2ForTokenClassification`.

Implemented in `_deberta_v2.py` (its parts: `_deberta_v2_layers.py`; heads: `_deberta_v2_heads.py`).
"""

from treemod.models._deberta_v2 import DebertaV2Model
from treemod.models._deberta_v2_heads import (
    DebertaV2ForMaskedLM,
    DebertaV2ForSequenceClassification,
    DebertaV2ForTokenClassification,
)

__all__ = [
    "DebertaV2Model",
    "DebertaV2ForMaskedLM",
    "DebertaV2ForSequenceClassification",
    "DebertaV2ForTokenClassification",
]
