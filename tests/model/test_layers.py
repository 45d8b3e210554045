"""Model building blocks: QuantLinear's two CPU paths, HF parameter names, Attention's step methods."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import pack_codes, quant_matmul_ref
from edgellm.model.config import ModelConfig
from edgellm.model.layers import DEQUANT_BLOCK_N, Attention, QuantLinear
from edgellm.model.llama import CausalLM


def _random_qweight(K: int, N: int, bits: int, group_size: int, act_order: bool, seed: int = 0) -> QuantizedWeight:
    g = torch.Generator().manual_seed(seed)
    G = -(-K // group_size)
    codes = torch.randint(0, 2**bits, (K, N), generator=g)
    scales = (torch.rand(G, N, generator=g) * 0.02 + 0.001).to(torch.float16)
    zeros = torch.randint(0, 2**bits, (G, N), generator=g).to(torch.float16)
    perm = torch.randperm(K, generator=g).to(torch.int32) if act_order else None
    return QuantizedWeight(pack_codes(codes, bits), scales, zeros, bits, group_size, perm, K)


@pytest.mark.parametrize(("bits", "group_size", "act_order"), [(4, 128, True), (8, 64, False), (2, 96, True)])
def test_cached_weight_equals_quant_matmul(bits: int, group_size: int, act_order: bool) -> None:
    """N spans several dequant blocks, K has a partial last group; the cached dense weight is exact."""
    K, N = 320, DEQUANT_BLOCK_N + 76
    qw = _random_qweight(K, N, bits, group_size, act_order)
    x = torch.randn(3, 5, K)
    bias = torch.randn(N)
    expected = quant_matmul_ref(x, qw, bias)

    with torch.device("meta"):
        cached = QuantLinear(K, N, bias=True)
    cached.load_quantized(qw, torch.float32)
    cached.load_bias(bias)
    on_the_fly = QuantLinear(K, N, bias=True)
    on_the_fly.load_quantized(qw, None)
    on_the_fly.load_bias(bias)

    assert cached.weight.shape == (N, K) and on_the_fly.weight is None
    torch.testing.assert_close(cached(x), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(on_the_fly(x), expected, atol=0, rtol=0)


def test_cached_weight_keeps_the_compute_dtype() -> None:
    qw = _random_qweight(256, 64, 4, 128, act_order=False)
    layer = QuantLinear(256, 64, bias=False)
    layer.load_quantized(qw, torch.bfloat16)
    assert layer.weight.dtype == torch.bfloat16 and layer.qweight is qw


HF_CLASSES = {
    "tiny-llama": transformers.LlamaForCausalLM,
    "arch/mistral": transformers.MistralForCausalLM,
    "arch/qwen2": transformers.Qwen2ForCausalLM,
    "arch/qwen3": transformers.Qwen3ForCausalLM,
}


@pytest.mark.parametrize("name", sorted(HF_CLASSES))
def test_parameter_names_and_shapes_are_huggingface(fixtures_dir: Path, name: str) -> None:
    raw = json.loads((fixtures_dir / name / "config.json").read_text())
    hf_config = transformers.AutoConfig.for_model(**raw)
    with torch.device("meta"):
        hf = HF_CLASSES[name](hf_config)
        ours = CausalLM(ModelConfig.from_dict(raw))
    hf_shapes = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    our_shapes = {k: tuple(v.shape) for k, v in ours.state_dict().items()}
    if raw["tie_word_embeddings"]:
        hf_shapes.pop("lm_head.weight", None)
        our_shapes.pop("lm_head.weight")  # the loader ties it to embed_tokens
    assert our_shapes == hf_shapes


def test_attention_steps_compose_with_explicit_positions(fixtures_dir: Path) -> None:
    """forward == o_proj(attend(rotate(project_qkv(x), positions))), and positions really move RoPE."""
    config = ModelConfig.from_file(fixtures_dir / "arch" / "qwen3")
    torch.manual_seed(0)
    attn = Attention(config)
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randn(1, 6, config.hidden_size)
    positions = torch.arange(6)
    q, k, v = attn.project_qkv(x)
    assert q.shape == (1, 6, config.num_heads, config.head_dim) and k.shape == (1, 6, config.num_kv_heads, config.head_dim)
    q, k = attn.rotate(q, k, positions)
    torch.testing.assert_close(attn(x, positions), attn.o_proj(attn.attend(q, k, v).flatten(-2)))
    shifted, _ = attn.rotate(*attn.project_qkv(x)[:2], positions + 3)
    assert not torch.allclose(shifted, q)


def test_sliding_window_longer_input_is_refused(fixtures_dir: Path) -> None:
    raw = json.loads((fixtures_dir / "arch" / "mistral" / "config.json").read_text()) | {"sliding_window": 4}
    with torch.device("meta"):
        model = CausalLM(ModelConfig.from_dict(raw))
    with pytest.raises(ValueError, match="input_ids: 5 tokens exceed sliding_window 4"):
        model(torch.zeros(1, 5, dtype=torch.long, device="meta"))
