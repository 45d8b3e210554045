"""Every producer fixture loads and reproduces its reference logits (fixtures/README.md tolerances)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixture_paths import fixtures_root
from safetensors.torch import load_file

from edgellm import load_model
from edgellm.model.layers import QuantLinear

# (reference key, max-abs tolerance in fp32) by fixture kind
QUANTIZED = ("reference_logits", 1e-3)
FLOAT_BASE = ("ref_logits_unquantized", 1e-4)
ARCH = ("ref_logits", 1e-4)


def _fixture_dirs() -> list[str]:
    root = fixtures_root()
    found = [p for p in sorted(root.rglob("config.json")) if (p.parent / "reference.safetensors").is_file()]
    return [str(p.parent.relative_to(root)) for p in found]


def _expected(name: str) -> tuple[str, float]:
    if name.startswith("quantized/"):
        return QUANTIZED
    if name.startswith("arch/"):
        return ARCH
    return FLOAT_BASE


def test_fixture_listing_is_complete() -> None:
    names = _fixture_dirs()
    assert {"tiny-llama", "tiny-llama-odd", "arch/qwen3", "quantized/autogptq-w4-g128-sym"} <= set(names)
    assert len(names) >= 28


@pytest.mark.parametrize("name", _fixture_dirs())
def test_fixture_logits(fixtures_dir: Path, name: str) -> None:
    key, tol = _expected(name)
    ref = load_file(fixtures_dir / name / "reference.safetensors")
    model = load_model(fixtures_dir / name)
    logits = model(ref["input_ids"])
    assert logits.dtype == torch.float32 and logits.shape == ref[key].shape
    err = (logits - ref[key]).abs().max().item()
    assert err < tol, f"{name}: max-abs {err:.3g} vs {key}, tolerance {tol}"


@pytest.mark.parametrize("name", ["quantized/autogptq-w4-g128-asym-actorder", "quantized/ct-w4a16-g128-asym"])
def test_on_the_fly_quant_matmul_matches_cached_weight(fixtures_dir: Path, name: str) -> None:
    """The CPU cache is an optimisation only: dropping it (the GPU path: quant_matmul) gives the same logits."""
    ref = load_file(fixtures_dir / name / "reference.safetensors")
    model = load_model(fixtures_dir / name)
    cached = model(ref["input_ids"])
    quantized = [m for m in model.modules() if isinstance(m, QuantLinear) and m.qweight is not None]
    assert len(quantized) == 14  # 2 layers x 7 projections; lm_head stays dense
    for m in quantized:
        m.weight = None
    err = (model(ref["input_ids"]) - cached).abs().max().item()
    assert err < 1e-4


def test_float16_compute(fixtures_dir: Path) -> None:
    ref = load_file(fixtures_dir / "tiny-llama" / "reference.safetensors")
    model = load_model(fixtures_dir / "tiny-llama", dtype=torch.float16)
    assert all(p.dtype == torch.float16 for p in model.parameters())
    logits = model(ref["input_ids"])
    assert logits.dtype == torch.float16
    assert (logits.float() - ref["ref_logits_unquantized"]).abs().max().item() < 0.1


def test_tied_embeddings_share_one_tensor(fixtures_dir: Path) -> None:
    model = load_model(fixtures_dir / "arch" / "qwen2")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_autogptq_zero_biases_are_dropped(fixtures_dir: Path) -> None:
    """AutoGPTQ stores an all-zero bias per quantized Linear (T15); Llama has none, so none is kept."""
    model = load_model(fixtures_dir / "quantized" / "autogptq-w4-g128-sym")
    assert model.model.layers[0].self_attn.q_proj.bias is None
    assert model.model.layers[0].self_attn.q_proj.qweight.bits == 4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", _fixture_dirs())
def test_fixture_logits_on_cuda(fixtures_dir: Path, name: str) -> None:
    """device="cuda": no dequantized cache, every quantized Linear runs through quant_matmul."""
    key, tol = _expected(name)
    ref = load_file(fixtures_dir / name / "reference.safetensors")
    model = load_model(fixtures_dir / name, device="cuda")
    quantized = [m for m in model.modules() if isinstance(m, QuantLinear) and m.qweight is not None]
    assert all(m.weight is None and m.qweight.device.type == "cuda" for m in quantized)
    logits = model(ref["input_ids"].cuda()).cpu()
    err = (logits - ref[key]).abs().max().item()
    assert err < tol, f"{name}: max-abs {err:.3g} vs {key} on CUDA, tolerance {tol}"
