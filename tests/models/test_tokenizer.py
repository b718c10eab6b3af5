"""`Tokenizer` and `generate_text` against `transformers`' fast tokenizer and `generate`.

A small byte-level BPE is trained locally with `tokenizers` (no download), wrapped in
`transformers.PreTrainedTokenizerFast` with special tokens and a ChatML-style chat template
(loops, `raise_exception`, `tojson`, `{% generation %}`), and saved; treemod reads the directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from lm_reference import pair
from test_generate import CASES
from tokenizers import Tokenizer as Raw
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

import treemod as tm
from treemod.models import Tokenizer, generate_text

# A zoo family's agreement with the reference library's own implementation: `slow`, run on the
# newest end only (DEVELOPERS.md, "What the oldest end runs"); the layers, transforms and
# loading code it goes through are tested on both ends by their own files.
pytestmark = pytest.mark.slow

TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unknown role ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] }}"
    "{% endgeneration %}{% else %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TEXT = [
    "The quick brown fox jumps over the lazy dog. Don't panic, it's only a test!",
    "Pack my box with five dozen liquor jugs; sphinx of black quartz, judge my vow.",
    "Ünïcödé and émojis 🙂 travel through byte-level BPE unchanged.",
] * 20


@pytest.fixture(scope="module")
def directory(tmp_path_factory: Any) -> Path:
    raw = Raw(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=60 + 256,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    raw.train_from_iterator(TEXT, trainer)
    raw.post_processor = processors.TemplateProcessing(
        single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", 0)]
    )
    hf = transformers.PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<pad>",
        chat_template=TEMPLATE,
    )
    out = tmp_path_factory.mktemp("tokenizer")
    hf.save_pretrained(out)
    return Path(out)


@pytest.fixture(scope="module")
def reference(directory: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(directory)


def test_encoding_with_left_padding_equals_transformers(directory: Path, reference: Any) -> None:
    texts = ["The lazy dog.", "Ünïcödé 🙂 and a much longer sentence, judge my vow!", "x"]
    reference.padding_side = "left"
    want = reference(texts, padding=True, return_tensors="np")
    got = Tokenizer.from_pretrained(directory)(texts)
    np.testing.assert_array_equal(got["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(got["attention_mask"], want["attention_mask"])
    first = np.argmax(got["attention_mask"], axis=1)
    assert (got["input_ids"][np.arange(3), first] == 0).all()  # the post-processor's BOS


def test_decoding_equals_transformers(directory: Path, reference: Any) -> None:
    tok = Tokenizer.from_pretrained(directory)
    ids = reference("<|im_start|>user\nDon't panic 🙂<|im_end|>")["input_ids"]
    for skip in (False, True):
        assert tok.decode(ids, skip_special_tokens=skip) == reference.decode(
            ids, skip_special_tokens=skip
        )
    assert tok.eos_token_id == reference.eos_token_id and tok.pad_token_id == reference.pad_token_id


def test_chat_template_renders_as_transformers(directory: Path, reference: Any) -> None:
    tok = Tokenizer.from_pretrained(directory)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Ünïcödé?"},
        {"role": "assistant", "content": "Yes."},
        {"role": "user", "content": "And <b>html</b>?"},
    ]
    tools = [{"name": "lookup", "parameters": {"q": "<str>"}}]
    for prompt in (False, True):
        want = reference.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=prompt, tools=tools
        )
        assert tok.apply_chat_template(chat, add_generation_prompt=prompt, tools=tools) == want
    with pytest.raises(Exception, match="unknown role tool"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}])


def test_generate_text_equals_transformers_generate_and_decode(
    directory: Path, reference: Any
) -> None:
    config = {**CASES["llama"][3], "vocab_size": len(reference)}
    hf, model = pair(*CASES["llama"][:3], config)
    tok = Tokenizer.from_pretrained(directory)
    chats = [
        [{"role": "user", "content": "The quick brown fox?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Judge my vow."}],
    ]
    reference.padding_side = "left"
    texts = [
        reference.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in chats
    ]
    inputs = reference(texts, padding=True, add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = hf.generate(
            **inputs,
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=reference.eos_token_id,
            pad_token_id=reference.pad_token_id,
        )
    want = reference.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    got = generate_text(model, tok, chats, max_new_tokens=12)
    assert got == want
    one = generate_text(model, tok, chats[0], max_new_tokens=12)
    assert one == want[0]
    # A stop string ends the text with the token that completes it.
    stop = next(want[0][i : i + 2] for i in range(len(want[0]) - 2) if want[0][i : i + 2].strip())
    cut = generate_text(model, tok, chats[0], max_new_tokens=12, stop_strings=stop)
    assert stop in cut and want[0].startswith(cut) and len(cut) <= want[0].index(stop) + 8


def test_missing_and_damaged_files_are_named(tmp_path: Path, directory: Path) -> None:
    with pytest.raises(tm.CheckpointError, match=r"tokenizer\.json does not exist"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(tm.CheckpointError, match=r"tokenizer\.json is not a tokenizer"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text((directory / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text("[]")
    with pytest.raises(tm.CheckpointError, match=r"tokenizer_config\.json holds a list"):
        Tokenizer.from_pretrained(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ValueError, match="has no chat template"):
        Tokenizer.from_pretrained(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])
