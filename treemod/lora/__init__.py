"""`treemod.lora`: LoRA adapters in PEFT's layout.

`add_lora` wraps the layers that PEFT's `target_modules` would select; `trainable` splits the
adapters from the frozen weights; `merge`, `unmerge` and `unload` fold them in and take them
out; `save_adapter` and `load_adapter` read and write PEFT's adapter directories.
"""

from treemod.lora._adapter_save import save_adapter
from treemod.lora._files import load_adapter
from treemod.lora._layers import LoRAConv, LoRALayer, LoRALinear
from treemod.lora._merge import is_lora_layer, merge, trainable, unload, unmerge
from treemod.lora._select import add_lora, matches_target

__all__ = [
    "LoRAConv",
    "LoRALayer",
    "LoRALinear",
    "add_lora",
    "is_lora_layer",
    "load_adapter",
    "matches_target",
    "merge",
    "save_adapter",
    "trainable",
    "unload",
    "unmerge",
]
