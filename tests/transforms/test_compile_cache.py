"""enable_compile_cache: a second process loads the executable instead of compiling it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

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
