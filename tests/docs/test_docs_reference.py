"""Every public name of treemod, treemod.nn, treemod.models, treemod.lora, treemod.precision and
treemod.quant has a `::: treemod.NAME` entry in docs/api."""

import importlib
import pathlib
import re

import treemod

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def _documented() -> set[str]:
    text = "\n".join(p.read_text() for p in DOCS.rglob("*.md"))
    return set(re.findall(r"^:::\s*(treemod(?:\.\w+)+)\s*$", text, flags=re.M))


def test_every_public_name_is_in_the_api_reference() -> None:
    documented = _documented()
    modules = {"treemod": treemod}
    nn = getattr(treemod, "nn", None)
    if nn is not None:
        modules["treemod.nn"] = nn
    for name in ("treemod.models", "treemod.lora", "treemod.precision", "treemod.quant"):
        modules[name] = importlib.import_module(name)
    missing = [
        f"{prefix}.{name}"
        for prefix, module in modules.items()
        for name in module.__all__
        if f"{prefix}.{name}" not in documented
    ]
    assert not missing, f"public names with no '::: NAME' entry under docs/: {missing}"
