"""Shared test fixtures: where the producers' checkpoints live."""

from __future__ import annotations

from pathlib import Path

import pytest
from fixture_paths import fixtures_root


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    root = fixtures_root()
    if not root.is_dir():
        raise FileNotFoundError(f"fixtures: {root} is not a directory; set EDGELLM_FIXTURES")
    return root
