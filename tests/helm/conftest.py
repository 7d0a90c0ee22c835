"""Chart tests: helpers live in chartlib (tests/helm is on pytest's pythonpath)."""

from __future__ import annotations

from typing import Any

import pytest
from support.chart import crd_validators_from


@pytest.fixture(scope="session")
def crd_validators() -> dict[tuple[str, str], Any]:
    return crd_validators_from()
