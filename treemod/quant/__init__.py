"""`treemod.quant`: weight-only quantisation (int8, NF4, int4) by PEFT's `target_modules`.

`quantise` replaces the selected `Linear` layers with `Int8Linear`, `NF4Linear` or
`Int4Linear`, whose matmul dequantises a slice of rows at a time inside the compiled program;
`dequantise` gives the float model back. `NF4Linear` also holds bitsandbytes' FP4
(`quant_type="fp4"`, as FP4 checkpoints load). `treemod.lora.add_lora` adapts quantised
layers (QLoRA).
"""

from treemod.quant._awq import AWQLinear
from treemod.quant._compressed_tensors import PackedLinear
from treemod.quant._gptq import GPTQLinear
from treemod.quant._layers import Int4Linear, Int8Linear, NF4Linear, QuantLinear
from treemod.quant._quantise import dequantise, quantise

__all__ = [
    "AWQLinear",
    "GPTQLinear",
    "Int4Linear",
    "Int8Linear",
    "NF4Linear",
    "PackedLinear",
    "QuantLinear",
    "dequantise",
    "quantise",
]
