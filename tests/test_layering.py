"""Import rules of design §1, checked by walking each module's `ast` imports.

Every import counts, including ones inside functions: a lazy import still
creates the dependency. Modules that do not exist yet are skipped.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Source folder -> installed package name (pyproject maps kernels/ and quant/ under edgellm).
ROOTS = {"edgellm": REPO / "edgellm", "edgellm.kernels": REPO / "kernels", "edgellm.quant": REPO / "quant"}
STDLIB = sys.stdlib_module_names
PURE_ENGINE = [
    f"edgellm.engine.{m}"
    for m in ("scheduler", "kv_cache_manager", "block_pool", "request", "sched_output", "sampling_params")
]


def module_files() -> dict[str, Path]:
    """Installed module name -> file, for every .py under the three roots."""
    files = {}
    for package, root in ROOTS.items():
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            files[".".join([package, *parts])] = path
    return files


FILES = module_files()


def imports_of(name: str) -> set[str]:
    """Absolute names of everything a module imports (relative imports resolved)."""
    path = FILES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            found.add(mod)
            found.update(f"{mod}.{alias.name}" for alias in node.names if f"{mod}.{alias.name}" in FILES)
    return found


def under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules(prefix: str) -> list[str]:
    return sorted(n for n in FILES if under(n, (prefix,)))


def violations(names: list[str], allowed) -> list[str]:
    return [f"{n} imports {imp}" for n in names for imp in sorted(imports_of(n)) if not allowed(imp)]


def top(name: str) -> str:
    return name.split(".")[0]


def test_pure_engine_modules_import_no_torch():
    present = [n for n in PURE_ENGINE if n in FILES]
    edgellm_ok = tuple(PURE_ENGINE) + ("edgellm.config",)
    bad = violations(present, lambda imp: top(imp) in STDLIB or under(imp, edgellm_ok))
    assert bad == []


def test_pure_engine_modules_load_without_torch():
    present = [n for n in PURE_ENGINE if n in FILES]
    heavy = "('torch', 'numpy', 'triton')"
    code = f"import sys; import {', '.join(present)}; print(sorted(m for m in {heavy} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_config_imports_nothing_from_edgellm():
    assert violations(["edgellm.config"], lambda imp: top(imp) != "edgellm") == []


def test_kernels_import_only_torch_triton_stdlib_and_themselves():
    allowed = lambda imp: top(imp) in STDLIB or top(imp) in ("torch", "triton") or under(imp, ("edgellm.kernels",))
    assert violations(modules("edgellm.kernels"), allowed) == []


def test_quant_never_imports_triton_engine_or_model():
    forbidden = ("triton", "edgellm.engine", "edgellm.model", "edgellm.loader", "edgellm.server")
    assert violations(modules("edgellm.quant"), lambda imp: not under(imp, forbidden)) == []


def test_model_imports_only_kernels_among_edgellm_packages():
    allowed = lambda imp: top(imp) != "edgellm" or under(imp, ("edgellm.model", "edgellm.kernels"))
    assert violations(modules("edgellm.model"), allowed) == []


def test_loader_builds_the_model_but_never_imports_the_engine():
    # docs/design.md §1: load_model composes ModelConfig + CausalLM + weights, so the loader
    # may import edgellm.model (one way: the model never imports the loader).
    forbidden = ("edgellm.engine", "edgellm.server", "edgellm.cli", "edgellm.hub")
    assert violations(modules("edgellm.loader"), lambda imp: not under(imp, forbidden)) == []
