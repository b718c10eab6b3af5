"""ResNet-18's first call in fresh processes with the garbage collector held off during it.

    python -m benchmarks.experiments.first_call_gc_off [repeats]

Variants, run in turn (order reversed every other repeat): plain JAX, treemod and Haiku with
`gc.disable()` just before the first call ("nogc"); treemod after one eager forward pass on a
batch-1 sample, as Haiku's `init` runs ("forward"); treemod and Haiku as the suite runs them
("plain"). Prints each process's first call, its trace / lowering / compile split and the
milliseconds spent in full collections during it, then the medians.
"""

import json
import subprocess
import sys

from benchmarks import timing

CHILD = r"""
import gc, importlib, json, sys, time
import jax, jax.numpy as jnp
from benchmarks.worker import CompileEvents, _batch
from benchmarks.workloads import MODULES
from benchmarks.workloads.spec import workloads
jax.config.update("jax_enable_compilation_cache", False)
events = CompileEvents()
jax.monitoring.register_event_duration_secs_listener(events)
fw, variant = sys.argv[1], sys.argv[2]
w = workloads(False)["resnet18"]
case = importlib.import_module(MODULES[fw]).build(w)
model = case.make_model(0)
case.wait(model)
if variant == "forward":
    import treemod as tm
    logits, _ = tm.stateful(model)(jnp.zeros((1, w.image, w.image, 3)), key=None)
    logits.block_until_ready()
carry = case.make_carry(model)
case.wait(carry)
x, y = _batch(w, w.tiny_batch, case.channels_last)
gcs = []
def on_collect(phase, info):
    gcs.append((phase, info["generation"], time.perf_counter()))
gc.callbacks.append(on_collect)
if variant == "nogc":
    gc.disable()
events.reset()
t, c = time.perf_counter(), time.process_time()
carry, loss = case.step(carry, x, y)
jax.block_until_ready(loss)
case.wait(carry)
wall, cpu = time.perf_counter() - t, time.process_time() - c
full = [b - a for (pa, ga, a), (pb, gb, b) in zip(gcs[::2], gcs[1::2]) if ga == 2]
print(json.dumps({"wall": wall, "cpu": cpu, **events.summary(), "gen2_ms": 1e3 * sum(full)}))
"""
runs = [
    ("jax", "nogc"),
    ("treemod", "nogc"),
    ("treemod", "forward"),
    ("haiku", "nogc"),
    ("treemod", "plain"),
    ("haiku", "plain"),
]
repeats = int(sys.argv[1])
res = {r: [] for r in runs}
for i in range(repeats):
    order = runs if i % 2 == 0 else runs[::-1]
    for fw, v in order:
        out = subprocess.run([sys.executable, "-c", CHILD, fw, v], capture_output=True, text=True)
        if out.returncode:
            print(out.stderr[-2000:])
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        res[(fw, v)].append(r)
        print(fw, v, {k: round(x, 3) for k, x in r.items()}, flush=True)
for (fw, v), rs in res.items():
    print(
        "median", fw, v, {k: round(timing.summary([r[k] for r in rs])["median"], 3) for k in rs[0]}
    )
