"""A user's type checker sees through the public transforms (ParamSpec) and sees every parameter
of the per-dimension layers (`Conv2d`, ...): mypy, through its API.

Each test writes a small user module into `tmp_path` and runs `mypy.api.run` on it (the
package's analysis is cached in `.mypy_cache/typing-test`, so reruns are fast). It
checks what mypy reveals for the transformed function's call, and that a call with an argument
of the wrong type is reported.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import mypy_messages, snippet_line

pytestmark = pytest.mark.heavy  # fresh processes or tools


SNIPPET = """
    import jax
    import jax.numpy as jnp
    import treemod as tm

    def f(x: int, name: str) -> float:
        return float(x)

    jitted = tm.filter_jit(f)
    reveal_type(jitted(1, "a"))  # jit-result
    jitted("one", "a")  # jit-wrong
    reveal_type(tm.filter_jit(donate="all")(f)(1, name="a"))  # jit-decorator-options
    reveal_type(jitted.lower(1, "a").compile()(1, "a"))  # jit-aot
    reveal_type(jitted.with_max_traces(2)(1, "a"))  # jit-max-traces
    public: tm.JitWrapped[[int, str], float] = jitted  # jit-public-type
    reveal_type(jitted)  # jit-type

    class Model(tm.Module):
        w: jax.Array

        @tm.filter_jit
        def step(self, x: jax.Array) -> jax.Array:
            return self.w * x

    reveal_type(Model(jnp.ones(2)).step(jnp.ones(2)))  # jit-method
    Model(jnp.ones(2)).step("x")  # jit-method-wrong

    def loss(model: Model, x: jax.Array) -> jax.Array:
        return jnp.sum(model.w * x)

    tm.filter_grad(loss)(Model(jnp.ones(2)), jnp.ones(2))
    tm.filter_grad(loss)(Model(jnp.ones(2)), "x")  # grad-wrong
    tm.filter_value_and_grad(has_aux=False)(loss)(Model(jnp.ones(2)), 3)  # vg-wrong
    reveal_type(tm.filter_vmap(f)(1, "a"))  # vmap-result
    reveal_type(tm.filter_checkpoint(f)(1, "a"))  # remat-result
    tm.filter_checkpoint(policy=None)(f)("a", "a")  # remat-wrong
"""


def test_the_transforms_keep_the_signature_of_the_wrapped_function(tmp_path: Path) -> None:
    found = mypy_messages(tmp_path, SNIPPET)

    def at(marker: str) -> str:
        return found.get(snippet_line(SNIPPET, marker), "")

    def revealed(marker: str) -> str:
        match = re.search(r'Revealed type is "(?:builtins\.)?([^"]*)"', at(marker))
        return match.group(1) if match else f"nothing revealed: {found}"

    for marker in ("jit-result", "jit-decorator-options", "jit-aot", "jit-max-traces"):
        assert revealed(marker) == "float", marker
    assert revealed("jit-method").endswith(".Array")  # jax.Array, by its defining module
    # `filter_jit` returns the public, documented `treemod.JitWrapped`, generic in `f`'s
    # parameters and result.
    assert re.fullmatch(
        r"treemod\.[\w.]*JitWrapped\[\[.*int, .*str\], .*float\]", revealed("jit-type")
    )
    assert revealed("vmap-result") == "float"
    assert revealed("remat-result") == "float"
    wrong = ("jit-wrong", "jit-method-wrong", "grad-wrong", "vg-wrong", "remat-wrong")
    for marker in wrong:
        assert "[arg-type]" in at(marker), (marker, found)
    # Nothing else in the snippet is an error: the correct calls type-check.
    allowed = {snippet_line(SNIPPET, m) for m in wrong}
    assert [text for n, text in found.items() if "error" in text and n not in allowed] == []


LAYERS_SNIPPET = """
    import jax
    import treemod as tm

    key = jax.random.key(0)
    tm.nn.Conv2d(3, 8, kernel_size=3, padding="SAME", key=key)  # conv-ok
    tm.nn.Conv2d("3", 8, kernel_size=3, key=key)  # conv-channels
    tm.nn.Conv2d(3, 8, kernel_size=3.0, key=key)  # conv-kernel
    tm.nn.Conv2d(3, 8, kernel_size=3, strides=2, key=key)  # conv-keyword
    tm.nn.Conv2d(3, 8, kernel_size=3)  # conv-no-key
    tm.nn.Conv1d(3, 8, 3, use_bias="no", key=key)  # conv1d-bias
    tm.nn.ConvTranspose3d(3, 8, 3, output_padding="1", key=key)  # conv-transpose
    tm.nn.MaxPool2d(2, stride=2, channels_last=True)  # pool-ok
    tm.nn.MaxPool2d(2, dilation="2")  # max-pool-dilation
    tm.nn.AvgPool1d(2, dilation=2)  # avg-pool-dilation
    tm.nn.AdaptiveAvgPool2d((1, 1), channels_last="yes")  # adaptive
    reveal_type(tm.nn.Conv3d.__init__)  # signature
"""


def test_a_type_checker_sees_the_parameters_of_per_dimension_layers(tmp_path: Path) -> None:
    found = mypy_messages(tmp_path, LAYERS_SNIPPET)

    def at(marker: str) -> str:
        return found.get(snippet_line(LAYERS_SNIPPET, marker), "")

    assert at("conv-ok") == "" and at("pool-ok") == "", found
    for marker in ("conv-channels", "conv-kernel", "conv1d-bias", "conv-transpose"):
        assert "[arg-type]" in at(marker), (marker, found)
    for marker in ("max-pool-dilation", "adaptive"):
        assert "[arg-type]" in at(marker), (marker, found)
    assert 'Unexpected keyword argument "strides"' in at("conv-keyword"), found
    assert 'Unexpected keyword argument "dilation"' in at("avg-pool-dilation"), found
    assert 'Missing named argument "key"' in at("conv-no-key"), found
    # The parameters by name, not `Any`.
    revealed = at("signature")
    for name in (
        "in_channels: int",
        "kernel_size: int | typing.Sequence[int]",
        "key: ",
        "channels_last: bool",
    ):
        assert name in revealed, revealed
