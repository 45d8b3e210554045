"""Shared test fixtures: where the producers' checkpoints live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def fixtures_root() -> Path:
    """../shared/fixtures beside the checkout, or $EDGELLM_FIXTURES (a GPU machine has no ../shared)."""
    return Path(os.environ.get("EDGELLM_FIXTURES", REPO_ROOT.parent / "shared" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    root = fixtures_root()
    if not root.is_dir():
        raise FileNotFoundError(f"fixtures: {root} is not a directory; set EDGELLM_FIXTURES")
    return root
