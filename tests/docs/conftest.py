"""Markers of the docs tests."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "docs_build: builds HTML with mkdocs (the API pages only, ~10 s); "
        "`-m 'not docs_build'` leaves it out",
    )
