"""End to end on the GPU: each producer's checkpoint through load_model(device="cuda", fp16),
logits against the fixture's fp32 reference (marker gpu).

Tolerance: relative logits error <= 5e-3 and max-abs <= 5e-2 (fp16 activations; the fixtures'
references are fp32-exact, and AutoAWQ's own fp16 path lands ~7e-3 max-abs from them).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

FIXTURES = [
    "autogptq-w4-g128-sym",
    "autogptq-w4-g128-asym-actorder",
    "autogptq-w3-g128-asym",
    "autogptq-w8-g64-asym",
    "autogptq-w2-g64-sym",
    "autogptq-w4-g128-sym-partial",
    "gptqmodel-v2-w4-g128-asym",
    "autoawq-gemm-w4-g128",
    "autoawq-gemv-w4-g128",
    "ct-w4a16-g128-asym",
]


@pytest.mark.parametrize("name", FIXTURES)
def test_fixture_logits_fp16(fixtures_dir, name):
    from safetensors.torch import load_file

    import edgellm

    path = fixtures_dir / "quantized" / name
    if not path.is_dir():
        pytest.skip(f"{path} missing")
    ref = load_file(str(path / "reference.safetensors"))
    model = edgellm.load_model(path, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        logits = model(ref["input_ids"].cuda()).float().cpu()
    want = ref["reference_logits"]
    rel = ((logits - want).norm() / want.norm()).item()
    max_abs = (logits - want).abs().max().item()
    print(f"{name}: relative {rel:.2e}, max-abs {max_abs:.2e}")
    assert rel <= 5e-3 and max_abs <= 5e-2, f"{name}: relative {rel:.2e}, max-abs {max_abs:.2e}"
