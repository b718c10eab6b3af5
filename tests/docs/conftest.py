"""Markers of the docs tests, and their xdist group under pytest 9."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "docs_build: builds HTML with mkdocs (the API pages only, ~10 s); "
        "`-m 'not docs_build'` leaves it out",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Send the tests of an `xdist_group` here to one worker under `--dist loadgroup`.

    pytest-xdist (3.8) marks a group by appending `@group` to each item's `_nodeid`, which
    pytest 9 no longer reads (the id lives in `_id`): the group's tests were spread over the
    workers and each built the API site (~15 s). Where xdist's suffix did not take, set it here.
    """
    if not getattr(config.option, "loadgroup", False):  # set in xdist's workers only
        return
    from _pytest.nodeid import NodeId

    for item in items:
        if "@" in item.nodeid or not item.path.is_relative_to(HERE):
            continue
        names = sorted({str(m.args[0]) for m in item.iter_markers("xdist_group") if m.args})
        if names:
            item._id = NodeId.parse(f"{item.nodeid}@{'_'.join(names)}")  # type: ignore[attr-defined]
