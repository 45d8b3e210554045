"""Where the producers' checkpoints live (importable from test modules for parametrization).

A module of its own, not conftest: tests/kernels has a conftest.py too, and `from conftest
import ...` would pick whichever was imported first.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def fixtures_root() -> Path:
    """../shared/fixtures beside the checkout, or $EDGELLM_FIXTURES (a GPU machine has no ../shared)."""
    return Path(os.environ.get("EDGELLM_FIXTURES", REPO_ROOT.parent / "shared" / "fixtures"))
