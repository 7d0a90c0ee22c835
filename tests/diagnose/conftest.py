"""The recorded frontend-gil incident that the post-mortem and the scaling-advice tests read
(one Prometheus per test module)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.incident import Recorded, serve

from exporter.signatures.site import parse_config


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorded]:
    rec = serve(parse_config({}), tmp_path_factory.mktemp("incident"))
    try:
        yield rec
    finally:
        rec.server.stop()
