# exports: MixtralModel, MixtralForCausalLM
"""Mixtral: `MixtralModel`, `MixtralForCausalLM` and their sparse mixture of experts
(implemented in `_mixtral.py` on the Llama implementation). Attribute paths are `transformers`'
parameter names; files keep its per-expert `block_sparse_moe` layout."""

from treemod.models._mixtral import (
    MixtralExperts,
    MixtralForCausalLM,
    MixtralModel,
    MixtralSparseMoeBlock,
)

__all__ = ["MixtralExperts", "MixtralForCausalLM", "MixtralModel", "MixtralSparseMoeBlock"]
