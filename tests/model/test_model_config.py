"""ModelConfig.from_dict: architectures, dims, dtype and RoPE across transformers 4 and 5 spellings (formats.md T10)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from edgellm.model.config import ModelConfig, RopeConfig

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 512,
    "max_position_embeddings": 2048,
}
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


def test_transformers5_and_transformers4_spellings_agree() -> None:
    new = ModelConfig.from_dict({**BASE, "dtype": "bfloat16", "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}})
    old = ModelConfig.from_dict({**BASE, "torch_dtype": "bfloat16", "rope_theta": 5e5, "rope_scaling": {"type": "llama3", **LLAMA3}})
    both = ModelConfig.from_dict(
        {**BASE, "dtype": "bfloat16", "torch_dtype": "bfloat16", "rope_theta": 5e5,
         "rope_scaling": {"rope_type": "llama3", **LLAMA3}, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}}
    )
    assert new == old == both
    assert new.rope == RopeConfig(5e5, "llama3", 8.0, 1.0, 4.0, 64) and new.dtype == torch.bfloat16


def test_defaults() -> None:
    c = ModelConfig.from_dict({**BASE, "num_key_value_heads": None, "head_dim": None})
    assert (c.num_kv_heads, c.head_dim, c.rope, c.dtype, c.tie_word_embeddings) == (4, 64, RopeConfig(10000.0), torch.float32, False)
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias or c.qk_norm)


def test_rope_theta_from_top_level_fills_rope_parameters() -> None:
    c = ModelConfig.from_dict({**BASE, "rope_theta": 1e6, "rope_parameters": {"rope_type": "default"}})
    assert c.rope.theta == 1e6


def test_llama3_original_max_defaults_to_max_position_embeddings() -> None:
    params = {k: v for k, v in LLAMA3.items() if k != "original_max_position_embeddings"}
    c = ModelConfig.from_dict({**BASE, "rope_scaling": {"rope_type": "llama3", **params}})
    assert c.rope.original_max_position_embeddings == 2048


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"architectures": ["GPT2LMHeadModel"]},
         "config.json architectures: unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM, "
         "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"),
        ({"rope_theta": 1e4, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, "config.json rope_parameters: "),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "config.json rope_scaling.rope_type: expected one of default, llama3, got 'yarn'"),
        ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "config.json rope_scaling: rope_type 'llama3' needs low_freq_factor"),
        ({"dtype": "float16", "torch_dtype": "bfloat16"}, "config.json dtype: 'dtype' 'float16' and 'torch_dtype' 'bfloat16' disagree"),
        ({"hidden_act": "gelu"}, "config.json hidden_act: expected 'silu', got 'gelu'"),
        ({"num_key_value_heads": 3}, "config.json num_attention_heads: expected a multiple of num_key_value_heads 3, got 4"),
        ({"hidden_size": "256"}, "config.json hidden_size: expected int, got '256'"),
    ],
)
def test_refused(edit: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig.from_dict({**BASE, **edit})
    assert str(info.value).startswith(message)


def test_architecture_flags(fixtures_dir: Path) -> None:
    qwen2 = ModelConfig.from_file(fixtures_dir / "arch" / "qwen2")
    qwen3 = ModelConfig.from_file(fixtures_dir / "arch" / "qwen3")
    mistral = ModelConfig.from_file(fixtures_dir / "arch" / "mistral")
    assert qwen2.qkv_bias and not qwen2.o_bias and qwen2.tie_word_embeddings and not qwen2.qk_norm
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.qkv_bias
    assert mistral.rope.theta == 1e6 and mistral.sliding_window is None
    sliding = json.loads((fixtures_dir / "arch" / "mistral" / "config.json").read_text()) | {"sliding_window": 4096}
    assert ModelConfig.from_dict(sliding).sliding_window == 4096
    llama_bias = ModelConfig.from_dict({**BASE, "attention_bias": True, "mlp_bias": True})
    assert llama_bias.qkv_bias and llama_bias.o_bias and llama_bias.mlp_bias


@pytest.mark.parametrize(
    "rope",
    [{"rope_type": "default", "rope_theta": 10000.0}, {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3},
     {"rope_type": "llama3", "rope_theta": 5e5, "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
      "original_max_position_embeddings": 8192}],
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inv_freq_is_bit_identical_to_transformers(rope: dict, head_dim: int) -> None:
    hf = LlamaConfig(**{k: v for k, v in BASE.items() if k != "architectures"}, head_dim=head_dim, rope_parameters=dict(rope))
    if rope["rope_type"] == "default":
        expected = 1.0 / (rope["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    else:
        expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, torch.device("cpu"))
    ours = ModelConfig.from_dict({**BASE, "head_dim": head_dim, "rope_parameters": rope}).rope.inv_freq(head_dim)
    assert torch.equal(ours, expected)
