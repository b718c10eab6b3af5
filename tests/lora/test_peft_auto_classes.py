"""Adapters saved by `save_adapter` from zoo models of several families load with PEFT's auto
class for the task type written (causal LMs, seq2seq, a base encoder), over the base model
transformers saved, with the adapted model's outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np
import peft
import pytest
import torch
import transformers as T
from peft_reference import randomise_b

import treemod.lora as lora
import treemod.models as tmm

pytestmark = [
    pytest.mark.slow,
    # PEFT reads transformers' deprecated `is_gradient_checkpointing` (PEFT's use, not ours).
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

DECODER = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
T5 = {"vocab_size": 64, "d_model": 16, "d_kv": 4, "d_ff": 24, "num_layers": 2, "num_heads": 4}
IDS = np.array([[2, 5, 9, 3, 7, 12], [4, 4, 8, 10, 11, 13]])

# family: (transformers' class and config, config, PEFT targets, task type, PEFT's auto class)
CASES: dict[str, tuple[Any, Any, dict[str, Any], list[str], str, Any]] = {
    "qwen2": (
        T.Qwen2ForCausalLM,
        T.Qwen2Config,
        DECODER,
        ["q_proj", "v_proj", "down_proj"],
        "CAUSAL_LM",
        peft.AutoPeftModelForCausalLM,
    ),
    "gemma2": (
        T.Gemma2ForCausalLM,
        T.Gemma2Config,
        {**DECODER, "head_dim": 8},
        ["q_proj", "o_proj"],
        "CAUSAL_LM",
        peft.AutoPeftModelForCausalLM,
    ),
    "phi3": (  # fused projections
        T.Phi3ForCausalLM,
        T.Phi3Config,
        {**DECODER, "pad_token_id": 0},
        ["qkv_proj", "gate_up_proj"],
        "CAUSAL_LM",
        peft.AutoPeftModelForCausalLM,
    ),
    "mixtral": (
        T.MixtralForCausalLM,
        T.MixtralConfig,
        {**DECODER, "num_local_experts": 4, "num_experts_per_tok": 2},
        ["q_proj", "v_proj"],
        "CAUSAL_LM",
        peft.AutoPeftModelForCausalLM,
    ),
    "t5": (
        T.T5ForConditionalGeneration,
        T.T5Config,
        {**T5, "decoder_start_token_id": 0},
        ["q", "v", "wo"],
        "SEQ_2_SEQ_LM",
        peft.AutoPeftModelForSeq2SeqLM,
    ),
    "bert": (
        T.BertModel,
        T.BertConfig,
        {k: v for k, v in DECODER.items() if k != "num_key_value_heads"},
        ["query", "value"],
        "FEATURE_EXTRACTION",
        peft.AutoPeftModelForFeatureExtraction,
    ),
}


@pytest.mark.parametrize("family", list(CASES))
def test_peft_auto_class_loads_the_adapter(family: str, tmp_path: Path) -> None:
    hf_class, config_class, config, targets, task_type, auto = CASES[family]
    torch.manual_seed(0)
    hf_class(config_class(**config)).eval().save_pretrained(tmp_path / "base")
    model = tmm.from_pretrained(tmp_path / "base")
    tuned = randomise_b(lora.add_lora(model, targets, r=4, alpha=8, key=jax.random.key(3)))
    lora.save_adapter(tuned, tmp_path / "adapter", base_model_name_or_path=str(tmp_path / "base"))
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["task_type"] == task_type
    reference = auto.from_pretrained(str(tmp_path / "adapter")).eval()
    inputs = {"input_ids": IDS}
    if family == "t5":
        inputs["decoder_input_ids"] = IDS[:, :3]
    with torch.no_grad():
        out = reference(**{k: torch.tensor(v) for k, v in inputs.items()})
    want = out.last_hidden_state if family == "bert" else out.logits
    got = np.asarray(tuned(**inputs))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-5)
    assert np.abs(got - np.asarray(model(**inputs))).max() > 1e-3  # the adapters count
