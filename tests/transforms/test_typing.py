"""A user's type checker sees through the public transforms (ParamSpec): mypy, through its API.

Each test writes a small user module into `tmp_path` and runs `mypy.api.run` on it (the
package's analysis is cached in `.mypy_cache/typing-test`, so reruns are fast). It
checks what mypy reveals for the transformed function's call, and that a call with an argument
of the wrong type is reported.
"""

from __future__ import annotations

import re
import textwrap
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy  # fresh processes or tools

mypy_api = pytest.importorskip("mypy.api")


_CACHE = Path(__file__).resolve().parents[2] / ".mypy_cache" / "typing-test"


def _mypy(tmp_path: Path, source: str) -> dict[int, str]:
    """mypy's messages about the snippet, by line number (notes and errors joined)."""
    # A new module name each run: mypy would skip a module it finds fresh in its cache.
    path = tmp_path / f"user_code_{uuid.uuid4().hex}.py"
    path.write_text(textwrap.dedent(source))
    stdout, stderr, _ = mypy_api.run(
        [
            str(path),
            "--cache-dir",
            str(_CACHE),
            "--no-error-summary",
            "--show-error-codes",
            "--follow-imports=silent",
            "--ignore-missing-imports",
        ]
    )
    assert not stderr, stderr
    found: dict[int, str] = {}
    for line in stdout.splitlines():
        match = re.match(rf"{re.escape(str(path))}:(\d+): (.*)", line)
        if match:
            n = int(match.group(1))
            found[n] = (found.get(n, "") + " " + match.group(2)).strip()
    return found


def _line(source: str, marker: str) -> int:
    """The 1-based line of the snippet holding `# marker`."""
    lines = textwrap.dedent(source).splitlines()
    return next(i + 1 for i, text in enumerate(lines) if text.endswith(f"# {marker}"))


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
    found = _mypy(tmp_path, SNIPPET)

    def at(marker: str) -> str:
        return found.get(_line(SNIPPET, marker), "")

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
    allowed = {_line(SNIPPET, m) for m in wrong}
    assert [text for n, text in found.items() if "error" in text and n not in allowed] == []
