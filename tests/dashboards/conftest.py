"""Fixtures of the dashboard tests: the committed JSON, every query in it, template values."""

from __future__ import annotations

from typing import Any

import pytest
from support.dashboards import (
    DASHBOARDS,
    VARIANTS,
    PanelQuery,
    VariableQuery,
    collect_queries,
    collect_variables,
    load_boards,
)


@pytest.fixture(scope="session")
def boards() -> dict[str, dict[str, Any]]:
    loaded = load_boards()
    assert loaded, f"no dashboards in {DASHBOARDS}; run python -m dashboards"
    return loaded


@pytest.fixture(scope="session")
def panel_queries(boards: dict[str, dict[str, Any]]) -> list[PanelQuery]:
    return collect_queries(boards)


@pytest.fixture(scope="session")
def variable_queries(boards: dict[str, dict[str, Any]]) -> list[VariableQuery]:
    return collect_variables(boards)


@pytest.fixture(scope="session")
def variants() -> dict[str, dict[str, str]]:
    return VARIANTS
