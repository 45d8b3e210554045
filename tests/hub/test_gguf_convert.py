"""GGUF -> HF conversion pieces that can be checked without the real file.

Weights are decoded by gguf-py's own `gguf.quants.dequantize`, so there is no edgellm
block decoder to test here; the real file is checked end to end against transformers'
GGUF import in tests/e2e/test_smollm2.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgellm.hub.gguf_convert import hf_tensor_name, unpermute_rotary


def llama_cpp_permute(weights: np.ndarray, n_head: int, n_head_kv: int | None = None) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py `LlamaModel.permute`, transcribed (HF rows -> GGUF rows)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


@pytest.mark.parametrize(
    ("rows", "num_heads", "num_kv_heads", "cols"),
    [
        (576, 9, None, 576),  # SmolLM2-135M attn_q: 9 heads of 64
        (192, 9, 3, 576),  # SmolLM2-135M attn_k: the permute switches to the 3 KV heads
        (4096, 32, None, 8),  # Llama-7B-sized q rows, head_dim 128
        (192, 9, 3, None),  # a 1-D K bias
    ],
)
def test_unpermute_inverts_llama_cpp_permute(rows: int, num_heads: int, num_kv_heads: int | None, cols: int | None) -> None:
    rng = np.random.default_rng(0)
    hf = rng.standard_normal((rows, cols) if cols else (rows,)).astype(np.float32)
    gguf = llama_cpp_permute(hf, num_heads, num_kv_heads)
    assert not np.array_equal(gguf, hf)  # the permutation moves rows, so the round trip means something
    heads = num_kv_heads or num_heads
    np.testing.assert_array_equal(unpermute_rotary(gguf, heads), hf)


def test_unpermute_row_formula() -> None:
    """formats.md 5.4: gguf_row(h, i, half) = h*hd + 2i + half holds hf_row(h, half, i) = h*hd + half*hd/2 + i."""
    num_heads, head_dim = 3, 8
    gguf_rows = np.arange(num_heads * head_dim)
    hf_rows = unpermute_rotary(gguf_rows, num_heads)
    for h in range(num_heads):
        for i in range(head_dim // 2):
            for half in (0, 1):
                assert hf_rows[h * head_dim + half * head_dim // 2 + i] == h * head_dim + 2 * i + half


def test_unpermute_refuses_rows_not_divisible_by_heads() -> None:
    with pytest.raises(ValueError, match=r"rotary un-permute: expected rows divisible by 2 \* 9 heads, got 100"):
        unpermute_rotary(np.zeros((100, 4), np.float32), 9)


@pytest.mark.parametrize(
    ("gguf_name", "hf_name"),
    [
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("blk.0.attn_norm.weight", "model.layers.0.input_layernorm.weight"),
        ("blk.12.attn_q.weight", "model.layers.12.self_attn.q_proj.weight"),
        ("blk.29.attn_output.weight", "model.layers.29.self_attn.o_proj.weight"),
        ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
        ("blk.3.ffn_down.weight", "model.layers.3.mlp.down_proj.weight"),
    ],
)
def test_tensor_names(gguf_name: str, hf_name: str) -> None:
    assert hf_tensor_name(gguf_name, Path("m.gguf")) == hf_name


@pytest.mark.parametrize("gguf_name", ["rope_freqs.weight", "blk.0.attn_qkv.weight", "blk.x.attn_q.weight"])
def test_unknown_tensor_names_are_refused(gguf_name: str) -> None:
    with pytest.raises(ValueError, match=rf"m.gguf: tensor '{gguf_name}': expected a llama tensor name"):
        hf_tensor_name(gguf_name, Path("m.gguf"))
