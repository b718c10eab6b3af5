"""`Tokenizer`: a checkpoint's `tokenizer.json` through the `tokenizers` library, with its chat
template, as `transformers`' fast tokenizers read the same files.

`tokenizers` and `jinja2` are the `text` extra (`pip install treemod[text]`), imported when a
tokenizer is loaded. A chat template is untrusted code from the hub: it runs in `jinja2`'s
immutable sandbox with the names `transformers` gives templates (`raise_exception`,
`strftime_now`, a `tojson` that does not escape HTML, the special tokens as strings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

from treemod._saving.errors import CheckpointError

__all__ = ["Tokenizer"]

_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
)
# transformers' clean_up_tokenization: spaces before punctuation and English contractions.
_CLEAN_UP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
    (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip


def _token_text(value: Any) -> str | None:
    """A special token as `tokenizer_config.json` writes it: a string or an `AddedToken` dict."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e}).") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} holds a {type(value).__name__}, not a JSON object.")
    return value


class Tokenizer:
    """A Hugging Face tokenizer directory: text to ids and back, batches padded for
    `generate`, chat templates rendered as `transformers`' `apply_chat_template` does.

    Build it with `Tokenizer.from_pretrained(directory)`.

    Example:
        >>> import tempfile, json, os
        >>> from tokenizers import Tokenizer as Raw, models, pre_tokenizers
        >>> vocab = {"<eos>": 0, "hello": 1, "world": 2, "<pad>": 3}
        >>> raw = Raw(models.WordLevel(vocab, unk_token="<eos>"))
        >>> raw.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> d = tempfile.mkdtemp(); raw.save(os.path.join(d, "tokenizer.json"))
        >>> config = {"eos_token": "<eos>", "pad_token": "<pad>"}
        >>> with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        ...     json.dump(config, f)
        >>> from treemod.models import Tokenizer
        >>> tok = Tokenizer.from_pretrained(d)
        >>> batch = tok(["hello world", "world"])
        >>> batch["input_ids"].tolist(), batch["attention_mask"].tolist()
        ([[1, 2], [3, 2]], [[1, 1], [0, 1]])
    """

    def __init__(self, raw: Any, config: Mapping[str, Any], chat_template: str | None) -> None:
        self.raw = raw
        self.config = dict(config)
        self.chat_template = chat_template
        self.special_tokens = {n: t for n in _SPECIAL if (t := _token_text(config.get(n)))}

    @classmethod
    def from_pretrained(cls, path: str | Path) -> Tokenizer:
        """Load `tokenizer.json`, `tokenizer_config.json` (special tokens, chat template) and
        `chat_template.jinja` (which wins over the config's template) from a directory.

        Arguments:
            path: the checkpoint directory.

        Returns:
            The tokenizer.
        """
        try:
            from tokenizers import Tokenizer as Raw
        except ImportError:
            raise ImportError(
                "treemod.models.Tokenizer needs the `tokenizers` library: pip install "
                "'treemod[text]'."
            ) from None
        directory = Path(path).expanduser()
        file = directory / "tokenizer.json"
        if not file.is_file():
            raise CheckpointError(
                f"{file} does not exist: treemod reads fast tokenizers (tokenizer.json); save one "
                "with transformers' tokenizer.save_pretrained."
            )
        try:
            raw = Raw.from_file(str(file))
        except Exception as e:  # the tokenizers library raises its own Exception type
            raise CheckpointError(
                f"{file} is not a tokenizer the tokenizers library reads ({e})."
            ) from None
        config_file = directory / "tokenizer_config.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the "default" one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
            template = named.get("default")
        jinja = directory / "chat_template.jinja"
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        if template is not None and not isinstance(template, str):
            raise CheckpointError(f"{config_file}: 'chat_template' is not a string.")
        return cls(raw, config, template)

    def token_id(self, name: str) -> int | None:
        """The id of a special token by its role (`"eos_token"`, `"pad_token"`, ...), or None."""
        text = self.special_tokens.get(name)
        return None if text is None else self.raw.token_to_id(text)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence token's id."""
        return self.token_id("eos_token")

    @property
    def pad_token_id(self) -> int | None:
        """The padding token's id (None when the tokenizer has none)."""
        return self.token_id("pad_token")

    def __call__(
        self,
        texts: str | Sequence[str],
        *,
        add_special_tokens: bool = True,
        padding_side: str = "left",
    ) -> dict[str, np.ndarray]:
        """Encode texts as one padded batch: `{"input_ids", "attention_mask"}`, NumPy arrays
        `(batch, longest)`, as `transformers`' `tokenizer(texts, padding=True,
        return_tensors="np")`.

        Arguments:
            texts: a text or several.
            add_special_tokens: add the tokens `tokenizer.json`'s post-processor adds (a BOS).
            padding_side: `"left"` (the default: what `generate` needs) or `"right"`.

        Returns:
            The ids and the mask (1 for tokens, 0 for padding).
        """
        if padding_side not in ("left", "right"):
            raise ValueError(
                f"Tokenizer: padding_side must be 'left' or 'right'; got {padding_side!r}."
            )
        batch = [texts] if isinstance(texts, str) else list(texts)
        encoded = [
            e.ids for e in self.raw.encode_batch(batch, add_special_tokens=add_special_tokens)
        ]
        width = max((len(e) for e in encoded), default=0)
        pad = self.pad_token_id
        if pad is None:
            pad = self.eos_token_id if self.eos_token_id is not None else 0
        ids = np.full((len(encoded), width), pad, np.int32)
        mask = np.zeros((len(encoded), width), np.int32)
        for row, tokens in enumerate(encoded):
            span = (
                slice(width - len(tokens), width)
                if padding_side == "left"
                else slice(0, len(tokens))
            )
            ids[row, span], mask[row, span] = tokens, 1
        return {"input_ids": ids, "attention_mask": mask}

    def decode(self, ids: Any, *, skip_special_tokens: bool = False) -> str:
        """The text of one sequence of ids (as `transformers`' `decode`)."""
        text: str = self.raw.decode(
            [int(i) for i in np.asarray(ids).reshape(-1)], skip_special_tokens=skip_special_tokens
        )
        if self.config.get("clean_up_tokenization_spaces"):
            for before, after in _CLEAN_UP:
                text = text.replace(before, after)
        return text

    def batch_decode(self, ids: Any, *, skip_special_tokens: bool = False) -> list[str]:
        """The texts of a batch of id sequences."""
        return [
            self.decode(row, skip_special_tokens=skip_special_tokens) for row in np.asarray(ids)
        ]

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        **extra: Any,
    ) -> str:
        """Render a conversation with the checkpoint's chat template, as `transformers`'
        `apply_chat_template(..., tokenize=False)`.

        Arguments:
            messages: `[{"role": "user", "content": "..."}, ...]`.
            add_generation_prompt: end with the template's start of an assistant turn.
            tools: JSON schemas of tools, for templates that read them.
            extra: other variables the template reads.

        Returns:
            The prompt text (encode it with `add_special_tokens=False`: the template writes the
            special tokens itself).
        """
        if self.chat_template is None:
            raise ValueError(
                "Tokenizer.apply_chat_template: this tokenizer has no chat template (neither "
                "chat_template.jinja nor tokenizer_config.json's 'chat_template'); format the "
                "prompt yourself."
            )
        if not all(isinstance(m, Mapping) for m in messages):
            raise TypeError(
                "Tokenizer.apply_chat_template: each message must be a dict with 'role' and "
                "'content'."
            )
        template = _compile(self.chat_template)
        return str(
            template.render(
                messages=[dict(m) for m in messages],
                tools=None if tools is None else [dict(t) for t in tools],
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
                **extra,
            )
        )


def _compile(source: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        # `{% generation %}...{% endgeneration %}` marks assistant text for transformers'
        # masks; rendering keeps the text.
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(
                lineno
            )

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
