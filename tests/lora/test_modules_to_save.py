"""PEFT's `modules_to_save` (heads trained and saved whole beside the adapters), against PEFT:
treemod's adapters with a trained head load into PEFT with treemod's outputs, PEFT's load into
treemod with PEFT's, and the errors name the entry, module, file or tensor."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import peft
import pytest
import safetensors.numpy
import torch
import transformers as T
from peft_reference import randomise_b, randomise_peft_b, relative_error

import treemod as tm
import treemod.lora as lora
import treemod.nn as nn
from treemod import CheckpointError
from treemod.models import from_pretrained

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning"),
]

BERT = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 24, "max_position_embeddings": 32, "num_labels": 3}  # fmt: skip
DISTILBERT = {"vocab_size": 64, "dim": 16, "n_layers": 2, "n_heads": 2, "hidden_dim": 24,
              "max_position_embeddings": 32, "num_labels": 3}  # fmt: skip
LLAMA = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 2,
         "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
PREFIX = "base_model.model."
IDS = np.array([[2, 5, 9, 3, 7, 12], [4, 4, 8, 10, 11, 13]])


def _saved(hf_class: Any, config: Any, path: Path) -> Any:
    torch.manual_seed(0)
    hf = hf_class(config).eval()
    hf.save_pretrained(path)
    return hf


def _nudged(model: Any, names: list[str], seed: int) -> Any:
    """The model with the named tensors changed (a trained head)."""
    state = tm.state_dict(model)
    rng = np.random.default_rng(seed)
    new = {n: state[n] + rng.normal(0, 0.5, state[n].shape).astype(state[n].dtype) for n in names}
    return tm.load_state_dict(model, new, strict=False)[0]


def _flags(model: Any, spec: Any) -> dict[str, bool]:
    """The filter spec's flag per state-dict name (the tree and the spec share structure)."""
    marked = jax.tree.map(
        lambda x, f: (jnp.ones_like(x) if f else jnp.zeros_like(x)) if tm.is_array(x) else x,
        model,
        spec,
    )
    return {n: bool(np.all(v == 1)) for n, v in tm.state_dict(marked).items()}


@pytest.mark.parametrize(
    ("hf_class", "config_class", "config", "targets", "head"),
    [
        (T.BertForSequenceClassification, T.BertConfig, BERT, ["query", "value"], "classifier"),
        (T.BertForTokenClassification, T.BertConfig, BERT, ["query", "dense"], "classifier"),
        (
            T.DistilBertForSequenceClassification,
            T.DistilBertConfig,
            DISTILBERT,
            ["q_lin"],
            "classifier",
        ),
        (
            T.RobertaForSequenceClassification,
            T.RobertaConfig,
            {**BERT, "pad_token_id": 1, "max_position_embeddings": 40},
            ["query"],
            "classifier",
        ),
    ],  # fmt: skip
    ids=["bert-seq", "bert-token", "distilbert-seq", "roberta-seq"],
)
def test_a_trained_head_saves_with_the_adapters_and_peft_loads_both(
    hf_class: Any, config_class: Any, config: dict[str, Any], targets: list[str], head: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    hf = _saved(hf_class, config_class(**config, attn_implementation="eager"), tmp_path / "base")
    model = from_pretrained(tmp_path / "base", dtype=jnp.float32)
    tuned = lora.add_lora(model, targets, r=2, alpha=4, key=jax.random.key(1))
    task = "TOKEN_CLS" if "Token" in hf_class.__name__ else "SEQ_CLS"
    # What PEFT itself saves for this task and these targets: the adapters and the head.
    peft.get_peft_model(
        hf_class(hf.config), peft.LoraConfig(task_type=task, r=2, target_modules=targets)
    ).save_pretrained(tmp_path / "peft")
    peft_names = set(safetensors.numpy.load_file(tmp_path / "peft" / "adapter_model.safetensors"))
    head_names = sorted(n[len(PREFIX) :] for n in peft_names if ".lora_" not in n)
    assert head_names and all(n.split(".")[0].endswith(head) for n in head_names)
    # PEFT's SEQ_CLS/TOKEN_CLS train the head: the default spec marks it, and only it.
    flags = _flags(tuned, lora.trainable(tuned))
    assert {n for n, f in flags.items() if f} == set(head_names) | {
        n for n in flags if ".lora_" in n
    }
    assert not any(f for n, f in _flags(tuned, lora.trainable(tuned, [])).items() if head in n)
    tuned = _nudged(randomise_b(tuned, 2), head_names, seed=3)
    lora.save_adapter(tuned, tmp_path / "adapter")

    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["task_type"] == task
    assert written["modules_to_save"] == ["classifier", "score"]
    stored = safetensors.numpy.load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert set(stored) == peft_names

    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        want = reference(input_ids=torch.from_numpy(IDS)).logits.numpy()
    got = np.asarray(tuned(input_ids=jnp.asarray(IDS)))
    assert relative_error(got, want) <= 1e-5
    # The head matters: with the untrained one the outputs differ.
    fresh = lora.add_lora(model, targets, r=2, alpha=4, key=jax.random.key(1))
    untrained = np.asarray(randomise_b(fresh, 2)(input_ids=jnp.asarray(IDS)))
    assert relative_error(got, untrained) > 1e-3
    # PEFT's loader needs the head in a SEQ_CLS/TOKEN_CLS adapter: leaving it out is refused.
    with pytest.raises(ValueError, match=rf"save_adapter: task_type {task!r} adapters hold the "
                       rf"heads \[(.*, )?'{head}'"):  # fmt: skip
        lora.save_adapter(tuned, tmp_path / "bare", modules_to_save=[])


def test_peft_adapters_with_modules_to_save_load_into_treemod(tmp_path: Path) -> None:
    config = T.RobertaConfig(**BERT, pad_token_id=1, attn_implementation="eager")
    config.max_position_embeddings = 40
    hf = _saved(T.RobertaForSequenceClassification, config, tmp_path / "base")
    wrapped = peft.get_peft_model(
        hf, peft.LoraConfig(task_type="SEQ_CLS", r=2, lora_alpha=4, target_modules=["value"])
    )
    randomise_peft_b(wrapped)
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if "modules_to_save" in name:  # the head's trained copy (dense and out_proj)
                p.add_(0.5 * torch.randn(p.shape, generator=gen))
        want = wrapped.eval()(input_ids=torch.from_numpy(IDS)).logits.numpy()
    wrapped.save_pretrained(tmp_path / "adapter")

    model = lora.load_adapter(from_pretrained(tmp_path / "base"), tmp_path / "adapter")
    assert relative_error(np.asarray(model(input_ids=jnp.asarray(IDS))), want) <= 1e-5


def test_an_explicit_module_list_round_trips_through_peft(tmp_path: Path) -> None:
    config = T.LlamaConfig(**LLAMA, tie_word_embeddings=False, attn_implementation="eager")
    hf = _saved(T.LlamaForCausalLM, config, tmp_path / "base")
    model = from_pretrained(tmp_path / "base", dtype=jnp.float32)
    tuned = lora.add_lora(model, ["q_proj"], r=2, alpha=2, key=jax.random.key(0))
    flags = _flags(tuned, lora.trainable(tuned, ["lm_head"]))
    assert flags["lm_head.weight"] and not flags["model.embed_tokens.weight"]
    assert not any(_flags(tuned, lora.trainable(tuned))[n] for n in ("lm_head.weight",))
    tuned = _nudged(randomise_b(tuned, 1), ["lm_head.weight"], seed=4)
    lora.save_adapter(tuned, tmp_path / "adapter", modules_to_save=["lm_head"])
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())[
        "modules_to_save"
    ] == ["lm_head"]
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        want = reference(input_ids=torch.from_numpy(IDS)).logits.numpy()
    assert relative_error(np.asarray(tuned(input_ids=jnp.asarray(IDS))), want) <= 1e-5
    # treemod reads its own file back into the base model: adapters and head.
    back = lora.load_adapter(model, tmp_path / "adapter")
    assert np.array_equal(np.asarray(back.lm_head.weight), np.asarray(tuned.lm_head.weight))


def _tiny() -> Any:
    mlp = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0)),
                         nn.Linear(4, 2, key=jax.random.key(1))])  # fmt: skip
    return lora.add_lora(mlp, ["0"], r=2, alpha=2, key=jax.random.key(2))


def test_modules_to_save_errors_name_the_entry_and_the_module(tmp_path: Path) -> None:
    tuned = _tiny()
    with pytest.raises(ValueError, match=r"save_adapter: modules_to_save entry 'head' selects no "
                       r"module of the Sequential") as e:  # fmt: skip
        lora.save_adapter(tuned, tmp_path / "a", modules_to_save=["head"])
    assert "['0', '1']" in str(e.value)  # the top-level modules are listed
    with pytest.raises(ValueError, match=r"trainable: modules_to_save selects '0', which "
                       r"holds LoRA layers"):  # fmt: skip
        lora.trainable(tuned, ["0"])
    with pytest.raises(ValueError, match=r"modules_to_save holds \[''\]"):
        lora.trainable(tuned, [""])
    stack = nn.Sequential([nn.Stack.from_layers([nn.Linear(4, 4, key=jax.random.key(i))
                                                 for i in range(2)])])  # fmt: skip
    with pytest.raises(ValueError, match=r"selects '0\.0', a module inside a Stack"):
        lora.trainable(stack, ["0.0"])


def test_load_adapter_refuses_heads_that_do_not_fit_naming_the_tensor(tmp_path: Path) -> None:
    tuned = _tiny()
    lora.save_adapter(tuned, tmp_path / "a", modules_to_save=["1"])
    base = nn.Sequential([nn.Linear(4, 4, key=jax.random.key(0)),
                          nn.Linear(4, 3, key=jax.random.key(1))])  # fmt: skip
    with pytest.raises(CheckpointError, match=r"modules_to_save tensors of other shapes") as e:
        lora.load_adapter(base, tmp_path / "a")
    assert "base_model.model.1.weight: the file has [2, 4]" in str(e.value)

    config_file = tmp_path / "a" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "modules_to_save": "1"}))
    with pytest.raises(CheckpointError, match=r"'modules_to_save' must be null or a list"):
        lora.load_adapter(tuned, tmp_path / "a")

    # A file listing a head without its tensors: the head's tensors are named as missing.
    lora.save_adapter(tuned, tmp_path / "b", modules_to_save=[])
    config_file = tmp_path / "b" / "adapter_config.json"
    config = json.loads(config_file.read_text())
    config_file.write_text(json.dumps({**config, "modules_to_save": ["1"]}))
    with pytest.raises(CheckpointError, match=r"missing \['1\.bias', '1\.weight'\]"):
        lora.load_adapter(lora.unload(tuned), tmp_path / "b")


def test_an_adapted_head_is_not_also_saved_whole(tmp_path: Path) -> None:
    # LoRA on the classifier itself: the head is adapted, not trained whole, so the defaults
    # leave it to the adapters and write no task type (PEFT's SEQ_CLS model would save the head
    # whole and never adapt it; its plain PeftModel loads these adapters).
    hf = _saved(T.BertForSequenceClassification, T.BertConfig(**BERT), tmp_path / "base")
    model = from_pretrained(tmp_path / "base", dtype=jnp.float32)
    tuned = randomise_b(lora.add_lora(model, ["query", "classifier"], r=2, alpha=4,
                                      key=jax.random.key(1)), 2)  # fmt: skip
    flags = _flags(tuned, lora.trainable(tuned))
    assert {n for n, f in flags.items() if f} == {n for n in flags if ".lora_" in n}
    lora.save_adapter(tuned, tmp_path / "adapter")
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["task_type"] is None and written["modules_to_save"] is None
    reference = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        want = reference(input_ids=torch.from_numpy(IDS)).logits.numpy()
    assert relative_error(np.asarray(tuned(input_ids=jnp.asarray(IDS))), want) <= 1e-5
    # Asked for SEQ_CLS, it is refused by name: PEFT could not load it.
    with pytest.raises(ValueError, match=r"task_type 'SEQ_CLS' adapters hold the heads "
                       r"\['classifier'\] whole, unadapted and float"):  # fmt: skip
        lora.save_adapter(tuned, tmp_path / "b", task_type="SEQ_CLS")
