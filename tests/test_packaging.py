"""The install layout: kernels/ and quant/ install as edgellm.kernels / edgellm.quant, never bare.

PyPI has unrelated packages named `kernels` and `quant`, so neither bare name may become
importable from an installed edgellm (regular wheel or editable install).
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent

MAPPED = {"edgellm": "edgellm", "edgellm.kernels": "kernels", "edgellm.quant": "quant"}


def _source_dir(package: str) -> Path:
    for prefix, folder in sorted(MAPPED.items(), key=lambda kv: -len(kv[0])):
        if package == prefix or package.startswith(prefix + "."):
            rest = package[len(prefix) :].lstrip(".")
            return REPO_ROOT / folder / rest.replace(".", "/")
    raise AssertionError(f"{package} is outside the mapped packages")


def test_every_source_package_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for prefix, folder in MAPPED.items():
        for init in (REPO_ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO_ROOT / folder).parts
            found.add(".".join((prefix, *rel)))
    assert found == listed
    assert all((_source_dir(p) / "__init__.py").is_file() for p in listed)


def test_editable_install_maps_names_and_hides_bare_ones(tmp_path: Path) -> None:
    # Run from an unrelated directory so the repository root is not on sys.path.
    code = (
        "import importlib.util, edgellm.kernels, edgellm.quant;"
        "print(edgellm.kernels.__file__);print(edgellm.quant.__file__);"
        "print(importlib.util.find_spec('kernels'), importlib.util.find_spec('quant'))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    kernels_file, quant_file, bare = out.stdout.splitlines()
    assert Path(kernels_file) == REPO_ROOT / "kernels" / "__init__.py"
    assert Path(quant_file) == REPO_ROOT / "quant" / "__init__.py"
    assert bare == "None None"


def test_regular_wheel_holds_only_edgellm_tree(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO_ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("edgellm-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert top == {"edgellm", next(t for t in top if t.endswith(".dist-info"))}
    assert "edgellm/kernels/qweight.py" in names and "edgellm/quant/spec.py" in names
    assert "edgellm/kernels/reference.py" in names
