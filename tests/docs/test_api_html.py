"""The API reference as built: layers' `__call__` docs are shown, `Returns:` sections are whole.

mkdocs builds the `docs/api/` pages alone (with the site's mkdocstrings options, read from
mkdocs.yml) into a temporary folder, once for the module, and the tests read the HTML.
"""

from __future__ import annotations

import html
import importlib
import inspect
import os
import pathlib
import re
import subprocess
import sys

import pytest

import treemod as tm
import treemod.nn as nn

yaml = pytest.importorskip("yaml", reason="mkdocs (the `dev` extra) is not installed")
pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is not installed")

# Heavy: one mkdocs build (module fixture) that every test here reads.
pytestmark = [pytest.mark.docs_build, pytest.mark.heavy]

ROOT = pathlib.Path(__file__).resolve().parents[2]
_HEADING = re.compile(r'<h[1-6] id="(treemod\.[^"]+)"')


@pytest.fixture(scope="module")
def api_html(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """`{page name: HTML}` for the API pages, built with the site's own mkdocstrings options."""
    tmp = tmp_path_factory.mktemp("api_site")
    docs = tmp / "docs"
    (docs / "api").mkdir(parents=True)
    pages = sorted((ROOT / "docs" / "api").glob("*.md"))
    for page in pages:
        (docs / "api" / page.name).write_text(page.read_text())
    (docs / "index.md").write_text("# treemod API\n")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    mkdocstrings = next(p["mkdocstrings"] for p in config["plugins"] if "mkdocstrings" in p)
    python = mkdocstrings["handlers"]["python"]
    python["paths"] = [str(ROOT)]
    # Extensions given as files are relative to mkdocs.yml: make them absolute here.
    python["options"]["extensions"] = [
        str(ROOT / e) if isinstance(e, str) and ".py" in e else e
        for e in python["options"].get("extensions", [])
    ]
    config.update(
        docs_dir=str(docs),
        site_dir=str(tmp / "site"),
        strict=False,  # the pages link to concept pages that are not in this build
        plugins=[{"mkdocstrings": mkdocstrings}],
        nav=[{"API": [f"api/{p.name}" for p in pages]}],
    )
    (tmp / "mkdocs.yml").write_text(yaml.safe_dump(config))
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "-f", str(tmp / "mkdocs.yml")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return {p.stem: (tmp / "site" / "api" / p.stem / "index.html").read_text() for p in pages}


def _sections(page: str) -> dict[str, str]:
    """Each documented object's id and the plain text of its part of the page."""
    starts = [(m.start(), m.group(1)) for m in _HEADING.finditer(page)]
    out = {}
    for (start, name), (end, _) in zip(starts, [*starts[1:], (len(page), "")], strict=True):
        text = html.unescape(re.sub(r"<[^>]+>", " ", page[start:end]))
        out[name] = " ".join(text.split())
    return out


def _squeeze(text: str) -> str:
    """`text` without whitespace and backticks: rendering moves spaces around inline code."""
    return re.sub(r"[\s`]+", "", text)


def _all_sections(api_html: dict[str, str]) -> dict[str, str]:
    return {k: v for page in api_html.values() for k, v in _sections(page).items()}


def _resolve(name: str) -> object:
    """The object a `::: name` entry (or a heading id) documents."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attribute in parts[i:]:
            obj = getattr(obj, attribute)
        return obj
    raise LookupError(name)


def _documented_classes_with_a_call() -> dict[str, type]:
    """Every class the API pages document whose `__call__` (its own or inherited) has a
    docstring: every layer, in `treemod.nn` and in the compat namespace."""
    out = {}
    for page in sorted((ROOT / "docs" / "api").glob("*.md")):
        for name in re.findall(r"^::: (\S+)", page.read_text(), re.M):
            obj = _resolve(name)
            if not inspect.isclass(obj):
                continue
            owner = next((k for k in obj.__mro__ if "__call__" in vars(k)), object)
            if owner is not object and vars(owner)["__call__"].__doc__:
                out[name] = obj
    return out


def test_every_layer_call_is_documented_with_its_arguments(api_html: dict[str, str]) -> None:
    sections = _all_sections(api_html)
    classes = _documented_classes_with_a_call()
    layers = [n for n in nn.__all__ if inspect.isclass(getattr(nn, n))]
    # Every layer of treemod.nn is among them (KeySeq, a key helper, has no call).
    assert {f"treemod.nn.{n}" for n in layers} - set(classes) == {"treemod.nn.KeySeq"}
    assert len(classes) >= 50
    for name, cls in classes.items():
        key = f"{name}.__call__"
        assert key in sections, f"{key} is not in the API reference"
        doc = inspect.getdoc(cls.__call__)  # type: ignore[operator]
        assert doc is not None
        summary = _squeeze(doc.split("\n\n")[0])
        assert summary in _squeeze(sections[key]), (key, summary)
        if "Arguments:" in doc:
            assert "Parameters:" in sections[key], f"{key}: its arguments are not rendered"


def test_the_calls_say_what_the_issue_missed(api_html: dict[str, str]) -> None:
    sections = _all_sections(api_html)
    attention = sections["treemod.nn.MultiheadAttention.__call__"]
    assert "mask" in attention and "causal" in attention
    assert "(num_heads, q_seq, kv_seq)" in attention
    batch_norm = sections["treemod.nn.BatchNorm.__call__"]
    assert "(N, C, *spatial)" in batch_norm and "one example" in batch_norm
    assert "IndexError" in sections["treemod.nn.Embedding.__call__"]


def test_private_names_and_other_dunders_stay_hidden(api_html: dict[str, str]) -> None:
    names = set(_all_sections(api_html))
    assert not [n for n in names if re.search(r"\._[^_]", n)]
    assert not [n for n in names if re.search(r"\.__(?!call__$)\w+__$", n)]


def _returns_text(fn: object) -> str:
    doc = inspect.getdoc(fn)
    assert doc is not None
    match = re.search(r"^Returns:\n((?:    .*\n?|\n)+)", doc, re.M)
    assert match is not None
    return _squeeze(match.group(1))


@pytest.mark.parametrize(
    "fn",
    [
        tm.stateful,
        tm.filter_jit,
        tm.filter_vjp,
        tm.filter_make_jaxpr,
        tm.filter_jacfwd,
        tm.filter_value_and_grad,
    ],
    ids=lambda f: f.__name__,
)
def test_a_returns_section_is_one_row_holding_the_whole_text(
    api_html: dict[str, str], fn: object
) -> None:
    name = f"treemod.{fn.__name__}"  # type: ignore[attr-defined]
    page = next(p for p in api_html.values() if f'id="{name}"' in p)
    start = page.index(f'id="{name}"')
    following = _HEADING.search(page, start + 1)
    part = page[start : following.start() if following else len(page)]
    table = re.search(r"Returns:</span></p>\s*<table>(.*?)</table>", part, re.S)
    assert table is not None, f"{name} has no Returns table"
    rows = re.findall(r"<tr class=\"doc-section-item\">(.*?)</tr>", table.group(1), re.S)
    assert len(rows) == 1, f"{name}: its Returns section is split into {len(rows)} rows"
    text = _squeeze(html.unescape(re.sub(r"<[^>]+>", " ", rows[0])))
    assert _returns_text(fn) in text


def test_every_returns_section_is_one_row_holding_the_whole_text(
    api_html: dict[str, str],
) -> None:
    # Not only the entries the issue named: every documented object with a `Returns:` section,
    # one line or several (a wrapped line, or one holding a colon, split it before).
    checked = multi_line = 0
    for page in api_html.values():
        starts = [(m.start(), m.group(1)) for m in _HEADING.finditer(page)]
        for (start, name), (end, _) in zip(starts, [*starts[1:], (len(page), "")], strict=True):
            obj = _resolve(name)
            doc = inspect.getdoc(obj)
            section = re.search(r"^Returns:\n((?:    .*\n?)+)", doc or "", re.M)
            if section is None:
                continue
            part = page[start:end]
            tables = re.findall(r"Returns:</span></p>\s*<table>(.*?)</table>", part, re.S)
            assert len(tables) == 1, f"{name}: {len(tables)} Returns tables"
            rows = re.findall(r"<tr class=\"doc-section-item\">(.*?)</tr>", tables[0], re.S)
            assert len(rows) == 1, f"{name}: its Returns section is split into {len(rows)} rows"
            text = _squeeze(html.unescape(re.sub(r"<[^>]+>", " ", rows[0])))
            assert _returns_text(obj) in text, name
            checked += 1
            multi_line += len(section.group(1).strip().splitlines()) > 1
    assert checked >= 100 and multi_line >= 30, (checked, multi_line)


def test_example_sections_render_as_code(api_html: dict[str, str]) -> None:
    # `Example:` (the house heading) is read as Griffe's `Examples:` (docs/griffe_examples.py),
    # so doctests are highlighted code, not `>>>` turned into nested Markdown quotes.
    for name, page in api_html.items():
        assert "<blockquote>" not in page, f"api/{name}: an example rendered as quotes"
    # A field's default (Stack's `unroll = 1`) does not lend it `int`'s docstring.
    assert "int('0b100', base=0)" not in api_html["nn"]
    page = api_html["transforms"]
    start = page.index('id="treemod.filter_jit"')
    following = _HEADING.search(page, start + 1)
    part = page[start : following.start() if following else len(page)]
    assert "Examples:" in part and '<span class="gp">&gt;&gt;&gt; </span>' in part
