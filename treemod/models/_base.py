"""What every zoo model shares: `PretrainedConfig`, `PretrainedModel`, the architecture registry.

`from_pretrained` reads `config.json`'s `architectures[0]`, finds the class registered under that
name with `register_architecture`, and builds it with `cls.from_config`. Every config value a
model cannot compute exactly as `transformers` does is refused through `config_error`, so the
messages read alike across families.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import jax
import jax.numpy as jnp
from jax import Array

import treemod.nn as nn
from treemod._module.module import Module, field
from treemod._module.state import is_param
from treemod._saving.errors import CheckpointError
from treemod._tree.filters import combine, partition
from treemod._tree.filters import filter as filter_tree

if TYPE_CHECKING:
    from jax.typing import DTypeLike
    from jaxtyping import PRNGKeyArray

__all__ = [
    "PretrainedConfig",
    "PretrainedModel",
    "architecture_class",
    "config_error",
    "register_architecture",
    "registered_architectures",
]


def _freeze(value: Any, where: str) -> Any:
    """A JSON value with dicts made `PretrainedConfig`s and lists made tuples (hashable)."""
    if isinstance(value, Mapping):
        return PretrainedConfig(value, _where=where)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v, f"{where}[{i}]") for i, v in enumerate(value))
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(
        f"PretrainedConfig: {where or 'the config'} is {type(value).__name__} {value!r}; a "
        f"config holds only JSON values (dict, list, str, int, float, bool, None)."
    )


def _thaw(value: Any) -> Any:
    if isinstance(value, PretrainedConfig):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


def _hash_key(value: Any) -> Any:
    # Keys that tell 1, 1.0 and True apart: `config.json` written by one tool as 1.0 and by
    # another as 1 builds the same model, but bool and number differ.
    if isinstance(value, PretrainedConfig):
        items = tuple(sorted((k, _hash_key(v)) for k, v in value._values.items()))
        generation = None if value.generation is None else _hash_key(value.generation)
        return ("dict", items, generation)
    if isinstance(value, tuple):
        return ("list", tuple(_hash_key(v) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    return (type(value).__name__ if value is not None else "null", value)


class PretrainedConfig(Mapping[str, Any]):
    """An immutable, hashable view of a Hugging Face `config.json` dict.

    Zoo models keep it as a static field, so two models built from equal configs have equal tree
    structures (and share compiled programs). Nested dicts read back as `PretrainedConfig`s and
    lists as tuples; `to_dict()` gives the JSON-ready dict as read.

    Arguments:
        values: the config's key-value pairs (a dict read from `config.json`, or another
            `PretrainedConfig`). Keys are strings; values JSON values.
        generation: the checkpoint's `generation_config.json` (`generate`'s defaults), kept
            as the attribute `generation`; None for none. A `PretrainedConfig` built from
            another keeps the other's.

    Example:
        >>> from treemod.models import PretrainedConfig
        >>> c = PretrainedConfig({"n_embd": 32, "rope_scaling": {"rope_type": "linear"}})
        >>> c["n_embd"], c.n_embd, c.get("n_layer", 12), "n_embd" in c
        (32, 32, 12, True)
        >>> c["rope_scaling"]["rope_type"]
        'linear'
        >>> c == PretrainedConfig({"rope_scaling": {"rope_type": "linear"}, "n_embd": 32})
        True
        >>> c.to_dict()
        {'n_embd': 32, 'rope_scaling': {'rope_type': 'linear'}}
    """

    __slots__ = ("_values", "_hash", "_where", "generation")

    def __init__(
        self,
        values: Mapping[str, Any],
        *,
        generation: Mapping[str, Any] | None = None,
        _where: str = "",
    ) -> None:
        if generation is None and isinstance(values, PretrainedConfig):
            generation = values.generation
        # The checkpoint's `generation_config.json` (None without one): `generate`'s defaults.
        self.generation: PretrainedConfig | None = (
            None if generation is None else PretrainedConfig(generation, _where="generation")
        )
        if not isinstance(values, Mapping):
            raise TypeError(
                f"PretrainedConfig: expected a mapping (a dict read from config.json), got "
                f"{type(values).__name__}."
            )
        frozen: dict[str, Any] = {}
        for key, value in values.items():
            if not isinstance(key, str):
                raise TypeError(
                    f"PretrainedConfig: key {key!r} {'in ' + _where + ' ' if _where else ''}"
                    f"is {type(key).__name__}; config keys are strings."
                )
            frozen[key] = _freeze(value, f"{_where}.{key}" if _where else key)
        self._values = frozen
        self._where = _where
        self._hash: int | None = None

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            where = f"{self._where} " if self._where else ""
            raise KeyError(f"config {where}has no key {name!r}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        """The value of `name`, or `default` when the config does not hold it."""
        return self._values.get(name, default)

    def __getattr__(self, name: str) -> Any:
        # `config.vocab_size`, as `transformers`' config objects read (keys only; methods and
        # slots are found before this is called).
        if not name.startswith("_"):
            values = object.__getattribute__(self, "_values")
            if name in values:
                return values[name]
        raise AttributeError(
            f"PretrainedConfig has no key {name!r} (read keys with config.get({name!r}, "
            "default) or config[...])."
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready copy (plain dicts and lists), as read."""
        return {k: _thaw(v) for k, v in self._values.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PretrainedConfig):
            return NotImplemented
        equal: bool = _hash_key(self) == _hash_key(other)
        return equal

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(_hash_key(self))
        return self._hash

    def __treescope_repr__(self, path: str | None, subtree_renderer: Any) -> Any:
        """treescope's view: a foldable dict of the keys (its generation config as one more
        entry), not an object address."""
        from treescope import repr_lib

        values = dict(self._values)
        if self.generation is not None:
            values["(generation_config.json)"] = self.generation
        return repr_lib.render_dictionary_wrapper(
            object_type=type(self),
            wrapped_dict=values,
            path=path,
            subtree_renderer=subtree_renderer,
            roundtrippable=False,
        )

    def __repr__(self) -> str:
        text = json.dumps(self.to_dict(), sort_keys=True)
        if self.generation is not None:
            text += f", generation={json.dumps(self.generation.to_dict(), sort_keys=True)}"
        return f"PretrainedConfig({text})"


class PretrainedModel(Module):
    """The base of every zoo model: built from a `config.json`, named like Hugging Face's class.

    A subclass sets `architecture` (the name `config.json` lists under `architectures`, e.g.
    `"GPT2LMHeadModel"`) and `model_type` (e.g. `"gpt2"`), implements `from_config`, and is
    called with Hugging Face's input names as keyword arguments, returning one array (what
    `transformers` returns as `logits`, or `last_hidden_state` for a base model). Its attribute
    paths, under `tm.state_dict`'s naming rule, are the `transformers` class's parameter names.
    Decorate it with `register_architecture` so that `from_pretrained` finds it.

    `from_config` must be traceable under `tm.filter_eval_shape` (no Python decision on an
    array's value), so that loading builds a shape-only skeleton and fills it tensor by tensor.

    Example:
        >>> import jax, jax.numpy as jnp, treemod as tm
        >>> from treemod.models import PretrainedModel, register_architecture
        >>> @register_architecture
        ... class TinyRegressor(PretrainedModel):
        ...     architecture = "TinyRegressor"
        ...     model_type = "tiny-regressor"
        ...     proj: tm.nn.Linear
        ...
        ...     @classmethod
        ...     def from_config(cls, config, *, key, dtype=None):
        ...         config = tm.models.PretrainedConfig(config)
        ...         proj = tm.nn.Linear(config["hidden_size"], 1, key=key, dtype=dtype)
        ...         return cls(config=config, proj=proj)
        ...
        ...     def __call__(self, *, input_values):
        ...         return self.proj(jnp.asarray(input_values))
        >>> model = TinyRegressor.from_config({"hidden_size": 4}, key=jax.random.key(0))
        >>> model(input_values=jnp.ones((2, 4))).shape
        (2, 1)
        >>> model.tied_weights()
        {}
    """

    config: PretrainedConfig = field(static=True)
    architecture: ClassVar[str]
    model_type: ClassVar[str]
    # The field holding the base model in a class with a head (`"transformer"` in GPT-2), so
    # that a base model's checkpoint loads into it; "" for none.
    base_model_prefix: ClassVar[str] = ""
    # Regular expressions (`re.search`) of file tensors loading skips without a word, as
    # `transformers` does for the class (old files' buffers, e.g. GPT-2's `attn.bias`).
    keys_to_ignore_on_load_unexpected: ClassVar[tuple[str, ...]] = ()
    # `transformers` 5's conversion mapping for the class, where its files keep older names than
    # its modules: regex substitutions (`re.sub`) from file names to the model's names, applied in
    # order when loading (`load_renames`), and the ones undoing them when saving (`save_renames`).
    load_renames: ClassVar[tuple[tuple[str, str], ...]] = ()
    save_renames: ClassVar[tuple[tuple[str, str], ...]] = ()

    @classmethod
    @abc.abstractmethod
    def from_config(
        cls,
        config: Mapping[str, Any] | PretrainedConfig,
        *,
        key: PRNGKeyArray,
        dtype: DTypeLike | None = None,
    ) -> Self:
        """Build the model with random weights from a `config.json` dict.

        Arguments:
            config: the config (a dict or `PretrainedConfig`); keys it lacks take the defaults
                of the `transformers` config class.
            key: the PRNG key for the random initial weights.
            dtype: the parameters' floating dtype (default float32).

        Returns:
            The model. Config values the model does not implement raise `config_error`'s
            `CheckpointError`, naming the value.
        """

    @property
    def dtype(self) -> Any:
        """The floating dtype most of the parameters' bytes are in (`transformers`'
        `model.dtype`); float32 for a model without floating parameters."""
        sizes: dict[Any, int] = {}
        for leaf in jax.tree.leaves(self):
            if hasattr(leaf, "dtype") and jnp.issubdtype(leaf.dtype, jnp.floating):
                sizes[leaf.dtype] = sizes.get(leaf.dtype, 0) + leaf.size * leaf.dtype.itemsize
        return max(sizes, key=sizes.__getitem__) if sizes else jnp.dtype(jnp.float32)

    def num_parameters(self, *, exclude_embeddings: bool = False) -> int:
        """How many parameters the model holds, as `transformers`' `num_parameters()`: each
        array once (a tied head is the embedding), `State` (running statistics) left out.

        Arguments:
            exclude_embeddings: leave the `nn.Embedding` layers' weights out.

        Returns:
            The number of parameter elements.

        Example:
            >>> import jax
            >>> from treemod.models import GPT2LMHeadModel
            >>> config = {"n_embd": 8, "n_layer": 1, "n_head": 2, "vocab_size": 10,
            ...           "n_positions": 4}
            >>> model = GPT2LMHeadModel.from_config(config, key=jax.random.key(0))
            >>> model.num_parameters(), model.num_parameters(exclude_embeddings=True), model.dtype
            (1000, 888, dtype('float32'))
        """
        params = filter_tree(self, is_param)
        total = sum(x.size for x in jax.tree.leaves(params))
        if exclude_embeddings:
            embeddings = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.Embedding))
            total -= sum(e.weight.size for e in embeddings if isinstance(e, nn.Embedding))
        return int(total)

    def astype(self, dtype: DTypeLike) -> Self:
        """The model with every floating parameter cast to `dtype` (`transformers`'
        `model.to(dtype)`); integer arrays and `State` keep theirs.

        Arguments:
            dtype: a floating dtype (`jnp.bfloat16`, `"float16"`, ...).

        Returns:
            A new model.
        """
        target = jnp.dtype(dtype)
        if not jnp.issubdtype(target, jnp.floating):
            raise TypeError(
                f"{type(self).__name__}.astype: {target} is not a floating dtype; a model's "
                "floating parameters are cast, its integer arrays keep their dtype."
            )
        params, rest = partition(self, is_param)
        cast = jax.tree.map(lambda x: x.astype(target), params)
        model: Self = combine(cast, rest)
        return model

    @classmethod
    def peft_task_type(cls) -> str | None:
        """PEFT's `task_type` for adapters of this class (`save_adapter` writes it, so that
        `peft`'s `AutoPeftModelFor...` classes load them), from `transformers`' naming of the
        class: `...ForCausalLM`/`...LMHeadModel` `"CAUSAL_LM"`, `...ForConditionalGeneration`
        `"SEQ_2_SEQ_LM"`, `...ForSequenceClassification` `"SEQ_CLS"`,
        `...ForTokenClassification` `"TOKEN_CLS"` (PEFT trains and saves their `classifier` or
        `score` head whole: `treemod.lora.trainable` and `save_adapter` do the same), a base
        model `"FEATURE_EXTRACTION"`; None for other heads. A class named otherwise overrides
        it.

        Returns:
            The task type, or None.
        """
        name = cls.architecture
        for suffix, task in _TASK_TYPES:
            if name.endswith(suffix):
                return task
        return None if "For" in name else "FEATURE_EXTRACTION"

    def tied_weights(self) -> dict[str, str]:
        """Names that share another name's array: `{alias: source}` (PyTorch names).

        For example `{"lm_head.weight": "transformer.wte.weight"}` when a language model ties
        its head to its embedding. The model holds one array (at the source); loading accepts the
        alias when it equals the source or is absent, and saving writes what `transformers`
        writes. The default: no tied weights.

        Returns:
            The alias-to-source mapping (empty by default).
        """
        return {}

    @abc.abstractmethod
    def __call__(self, *args: Any, **inputs: Any) -> Array:
        """Run the model on Hugging Face's inputs given by name (`input_ids=...`, ...)."""


_TASK_TYPES = (
    ("ForCausalLM", "CAUSAL_LM"),
    ("LMHeadModel", "CAUSAL_LM"),
    ("ForConditionalGeneration", "SEQ_2_SEQ_LM"),
    ("ForSequenceClassification", "SEQ_CLS"),
    ("ForTokenClassification", "TOKEN_CLS"),
)
_M = TypeVar("_M", bound=type[PretrainedModel])
_REGISTRY: dict[str, type[PretrainedModel]] = {}


def register_architecture(cls: _M) -> _M:
    """Register a zoo model class under its `architecture` name, for `from_pretrained`.

    Arguments:
        cls: a subclass of `PretrainedModel` that sets `architecture`.

    Returns:
        `cls` itself (use it as a class decorator).

    Example:
        >>> from treemod.models import register_architecture, registered_architectures
        >>> import treemod.models
        >>> "TinyRegressor" in registered_architectures()  # registered in PretrainedModel's example
        True
    """
    if not (isinstance(cls, type) and issubclass(cls, PretrainedModel)):
        raise TypeError(
            f"register_architecture: {cls!r} is not a subclass of treemod.models.PretrainedModel."
        )
    name = getattr(cls, "architecture", None)
    if not isinstance(name, str) or not name:
        raise TypeError(
            f"register_architecture: {cls.__qualname__} does not set `architecture` (the class "
            f"name config.json lists under 'architectures', e.g. architecture = 'GPT2Model')."
        )
    known = _REGISTRY.get(name)
    if known is not None and known is not cls and _qualified(known) != _qualified(cls):
        raise ValueError(
            f"register_architecture: architecture {name!r} is already registered to "
            f"{_qualified(known)}; {_qualified(cls)} cannot take it too."
        )
    _REGISTRY[name] = cls
    return cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def registered_architectures() -> dict[str, type[PretrainedModel]]:
    """The registered architecture names and their classes (a copy).

    Returns:
        `{architecture name: class}`, sorted by name.

    Example:
        >>> import treemod.models as tmm
        >>> all(isinstance(name, str) for name in tmm.registered_architectures())
        True
    """
    return dict(sorted(_REGISTRY.items()))


def architecture_class(name: Any, source: str) -> type[PretrainedModel]:
    """The class registered under `name`, or a `CheckpointError` naming `source` and the known."""
    cls = _REGISTRY.get(name) if isinstance(name, str) else None
    if cls is None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise CheckpointError(
            f"{source}: architecture {name!r} is not one treemod.models implements (known: "
            f"{known}). Register your own PretrainedModel subclass with "
            f"treemod.models.register_architecture, or build the model yourself and load the "
            f"weights with tm.load_state_dict."
        )
    return cls


def config_error(model_cls_name: str, key: str, value: Any, supported: str) -> CheckpointError:
    """The error for a config value a zoo model does not implement (raise what it returns).

    Arguments:
        model_cls_name: the model class's name, e.g. `"LlamaForCausalLM"`.
        key: the config key, dotted for nested ones (`"rope_scaling.rope_type"`).
        value: the refused value.
        supported: what treemod supports for this key, in words.

    Returns:
        A `CheckpointError` whose message names the class, key, value and what is supported.

    Example:
        >>> from treemod.models import config_error
        >>> print(config_error("LlamaForCausalLM", "rope_scaling.rope_type", "yarn",
        ...                    "'default', 'linear', 'llama3'"))
        LlamaForCausalLM: config value rope_scaling.rope_type='yarn' is not supported (treemod supports: 'default', 'linear', 'llama3'); treemod refuses it rather than compute something other than transformers does.
    """  # noqa: E501
    return CheckpointError(
        f"{model_cls_name}: config value {key}={value!r} is not supported (treemod supports: "
        f"{supported}); treemod refuses it rather than compute something other than "
        f"transformers does."
    )
