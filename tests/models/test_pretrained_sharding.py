"""`from_pretrained(..., sharding=...)` on one process (eight CPU devices, tests/conftest.py),
and peak memory while loading (a subprocess reading its VmHWM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from pretrained_zoo import (
    DIM,
    LAYERS,
    VOCAB,
    assert_close,
    make_tensors,
    write,
)

from treemod.models import (
    from_pretrained,
)

# Sharded loading on one process (eight CPU devices, tests/conftest.py). -------------------------


def test_rules_place_each_array_on_its_shards(tmp_path: Path) -> None:
    tensors = make_tensors(12)
    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    rules = {
        r"^blocks\.\*\.weight$": PartitionSpec(None, "model", "data"),
        r"embed": PartitionSpec("model"),
    }
    model = from_pretrained(write(tmp_path, tensors), sharding=(mesh, rules))
    weight = model.blocks.layers.weight
    assert weight.sharding == NamedSharding(mesh, PartitionSpec(None, "model", "data"))
    assert len({s.data.shape for s in weight.addressable_shards}) == 1
    assert weight.addressable_shards[0].data.shape == (LAYERS, DIM // 2, DIM // 2)
    assert model.embed.weight.sharding == NamedSharding(mesh, PartitionSpec("model"))
    assert model.norm.bias.sharding.is_fully_replicated
    for i in range(LAYERS):
        np.testing.assert_array_equal(weight[i], tensors[f"blocks.{i}.weight"])
    assert_close(model, tensors)


def test_a_sharding_function_sees_paths_shapes_and_dtypes(tmp_path: Path) -> None:
    seen = {}
    device = jax.devices()[3]

    def where(path: str, shape: tuple[int, ...], dtype: Any) -> jax.sharding.Sharding:
        seen[path] = (shape, jnp.dtype(dtype).name)
        return jax.sharding.SingleDeviceSharding(device)

    model = from_pretrained(write(tmp_path, make_tensors()), sharding=where)
    assert seen["blocks.*.weight"] == ((LAYERS, DIM, DIM), "float32")
    assert seen["embed.weight"] == ((VOCAB, DIM), "float32")
    assert model.norm.weight.devices() == {device}


def test_a_rule_with_too_many_axes_names_the_tensor(tmp_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    with pytest.raises(ValueError, match=r"rule 'norm' gives .* to norm\.weight of shape \(8,\)"):
        from_pretrained(
            write(tmp_path, make_tensors()), sharding=(mesh, {"norm": PartitionSpec("x", None)})
        )


def test_a_rule_that_does_not_divide_a_tensor_names_tensor_and_rule(tmp_path: Path) -> None:
    mesh = Mesh(np.array(jax.devices()[:3]), ("x",))  # 3 does not divide 8
    with pytest.raises(
        ValueError, match=r"rule 'norm' gives norm\.weight of shape \(8,\) the sharding .*evenly"
    ):
        from_pretrained(
            write(tmp_path, make_tensors()), sharding=(mesh, {"norm": PartitionSpec("x")})
        )

    def where(path: str, shape: tuple[int, ...], dtype: Any) -> jax.sharding.Sharding:
        spec = PartitionSpec(None, "x") if path == "embed.weight" else PartitionSpec()
        return NamedSharding(mesh, spec)

    with pytest.raises(ValueError, match=r"the sharding function gives embed\.weight of shape"):
        from_pretrained(write(tmp_path / "f", make_tensors()), sharding=where)


def test_bad_sharding_arguments() -> None:
    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    from treemod.models._sharding import sharding_function

    with pytest.raises(TypeError, match="rule 'a' maps to 'x', not a jax.sharding.PartitionSpec"):
        sharding_function((mesh, {"a": "x"}))  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"rule '\(' is not a regular expression"):
        sharding_function((mesh, {"(": PartitionSpec()}))
    with pytest.raises(TypeError, match="takes a function"):
        sharding_function(3)  # type: ignore[arg-type]


# Memory. ----------------------------------------------------------------------------------------

_MEMORY_SCRIPT = """
import json, sys
import numpy as np, jax
from safetensors.numpy import save_file
import pretrained_zoo as t
from treemod.models import from_pretrained

directory = sys.argv[1]
rng = np.random.default_rng(0)
vocab, dim, layers = 60000, 256, 24
tensors = {"embed.weight": rng.standard_normal((vocab, dim), np.float32)}
for i in range(layers):
    tensors[f"blocks.{i}.weight"] = rng.standard_normal((dim, dim), np.float32)
    tensors[f"blocks.{i}.bias"] = np.zeros(dim, np.float32)
tensors["norm.weight"] = np.ones(dim, np.float32)
tensors["norm.bias"] = np.zeros(dim, np.float32)
size = sum(v.nbytes for v in tensors.values())
config = dict(t.CONFIG, vocab_size=vocab, hidden_size=dim, num_layers=layers)
t.write(__import__("pathlib").Path(directory), tensors, config)
del tensors
small = __import__("pathlib").Path(directory) / "small"
t.write(small, t.make_tensors())
from_pretrained(small)  # compile what loading compiles, outside the measurement

def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
model = from_pretrained(directory)
jax.block_until_ready(model)
print(json.dumps({"size": size, "peak": status("VmHWM") - base}))
"""


def test_loading_peaks_below_1_3_times_the_checkpoint(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    env["XLA_FLAGS"] = ""
    result = subprocess.run(
        [sys.executable, "-c", _MEMORY_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["size"] > 60e6
    assert figures["peak"] <= 1.3 * figures["size"], figures
