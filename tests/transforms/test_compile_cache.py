"""enable_compile_cache: a second process loads the executable instead of compiling it; in the
test process itself the cache is turned off again after the test (tests/conftest.py's guard)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax._src import compilation_cache

import treemod as tm
from tests.conftest import SESSION_CACHE_SETTINGS, restore_compile_cache_settings

_SCRIPT = """
import json, sys
import jax, jax.numpy as jnp
import treemod as tm

hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None
)
path = tm.enable_compile_cache(sys.argv[1])

class Affine(tm.Module):
    w: jax.Array
    name: str = tm.field(static=True, default="affine")
    def __call__(self, x):
        return jnp.tanh(self.w @ x)

step = tm.filter_jit(lambda m, x: tm.filter_grad(lambda m: jnp.sum(m(x)))(m))
model = Affine(jnp.arange(6.0).reshape(2, 3) / 10)
grads = step(model, jnp.ones(3))
print(json.dumps({"hits": len(hits), "grad": grads.w.tolist(), "path": str(path)}))
"""


def _run(cache: pathlib.Path) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(cache)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.heavy
def test_second_process_hits_the_persistent_cache(tmp_path: pathlib.Path) -> None:
    cache = tmp_path / "nested" / "cache"  # created on demand
    first = _run(cache)
    assert first["hits"] == 0
    assert first["path"] == str(cache.resolve())
    assert any(cache.iterdir()), "the first process wrote no cache entry"
    second = _run(cache)
    assert second["hits"] >= 1
    assert second["grad"] == first["grad"]


def test_a_cache_left_on_is_named_turned_off_and_written_to_no_more(tmp_path: pathlib.Path) -> None:
    cache = tm.enable_compile_cache(tmp_path / "left-on")
    assert jax.config.jax_compilation_cache_dir == str(cache)
    problem = restore_compile_cache_settings()
    assert problem is not None
    assert str(cache) in problem and "persistent_compile_cache" in problem
    start = SESSION_CACHE_SETTINGS["jax_compilation_cache_dir"]
    assert jax.config.jax_compilation_cache_dir == start
    assert compilation_cache._cache is None and not compilation_cache._cache_checked
    # A program compiled now (a shape no other test uses) opens no cache and writes nothing.
    jax.jit(lambda a: jnp.sin(a) * 3.0)(jnp.ones((3, 5, 7))).block_until_ready()
    assert compilation_cache._cache is None
    assert not any(cache.iterdir())
    assert restore_compile_cache_settings() is None  # nothing left to restore


def test_the_fixture_turns_the_cache_on(persistent_compile_cache: pathlib.Path) -> None:
    assert jax.config.jax_compilation_cache_dir == str(persistent_compile_cache)
    assert persistent_compile_cache.is_dir()
