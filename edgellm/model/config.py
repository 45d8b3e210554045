"""ModelConfig: the architecture of a Llama-family checkpoint, read from its config.json.

One frozen record for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and
Qwen3ForCausalLM: they differ only in flags (Qwen2's q/k/v biases, Qwen3's per-head
q/k RMSNorm), so the model code is one class.

RoPE keys differ across transformers versions (formats.md T10): transformers 4 writes
top-level `rope_theta` + `rope_scaling` (`type` or `rope_type`), transformers 5 writes
`rope_parameters`. Both are read; when a file carries both and they disagree, it is refused.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
DEFAULT_ROPE_THETA = 10000.0  # transformers' default_theta for all four architectures
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True, slots=True)
class RopeConfig:
    theta: float
    rope_type: str = "default"  # "default" or "llama3"
    # llama3 only (transformers `_compute_llama3_parameters`)
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 0

    def inv_freq(self, head_dim: int) -> torch.Tensor:
        """float32 [head_dim / 2], computed exactly as transformers does (same ops, same order)."""
        inv_freq = 1.0 / (self.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
        if self.rope_type == "default":
            return inv_freq
        old_context_len = self.original_max_position_embeddings
        low_freq_wavelen = old_context_len / self.low_freq_factor
        high_freq_wavelen = old_context_len / self.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / self.factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - self.low_freq_factor) / (self.high_freq_factor - self.low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / self.factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    architecture: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    vocab_size: int
    tie_word_embeddings: bool
    dtype: torch.dtype  # the checkpoint's float dtype (config `dtype` / `torch_dtype`)
    rope: RopeConfig
    max_position_embeddings: int
    qkv_bias: bool  # q/k/v projections carry a bias (Qwen2; Llama/Qwen3 with attention_bias)
    o_bias: bool  # o_proj carries a bias (Llama/Qwen3 attention_bias only)
    mlp_bias: bool  # gate/up/down carry a bias (Llama mlp_bias)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)
    sliding_window: int | None  # Mistral: attention beyond it would need a windowed mask

    def __post_init__(self) -> None:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"config.json num_attention_heads: expected a multiple of num_key_value_heads {self.num_kv_heads}, "
                f"got {self.num_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"config.json head_dim: expected an even number (RoPE pairs dims), got {self.head_dim}")

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file (a model directory needs config.json)")
        try:
            raw = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        if len(archs) != 1 or archs[0] not in SUPPORTED_ARCHITECTURES:
            found = archs[0] if len(archs) == 1 else archs
            raise ValueError(
                f"config.json architectures: unsupported architecture {found!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        arch = archs[0]
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"config.json hidden_act: expected 'silu', got {act!r}")
        hidden = _require(cfg, "hidden_size", int)
        heads = _require(cfg, "num_attention_heads", int)
        head_dim = cfg.get("head_dim") or hidden // heads
        attention_bias = bool(cfg.get("attention_bias", False))
        is_qwen2 = arch == "Qwen2ForCausalLM"
        sliding = cfg.get("sliding_window")
        use_sliding = cfg.get("use_sliding_window", arch == "MistralForCausalLM")
        return cls(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=_require(cfg, "intermediate_size", int),
            num_layers=_require(cfg, "num_hidden_layers", int),
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            rms_norm_eps=float(_require(cfg, "rms_norm_eps", float)),
            vocab_size=_require(cfg, "vocab_size", int),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            dtype=_read_dtype(cfg),
            rope=_read_rope(cfg),
            max_position_embeddings=_require(cfg, "max_position_embeddings", int),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            sliding_window=sliding if (use_sliding and sliding) else None,
        )


def _require(cfg: dict[str, Any], key: str, kind: type) -> Any:
    value = cfg.get(key)
    if not isinstance(value, (int, float) if kind is float else kind) or isinstance(value, bool):
        raise ValueError(f"config.json {key}: expected {kind.__name__}, got {value!r}")
    return value


def _read_dtype(cfg: dict[str, Any]) -> torch.dtype:
    # transformers 5 writes `dtype`, 4 writes `torch_dtype`; re-saved files may carry both.
    names = {key: cfg[key] for key in ("dtype", "torch_dtype") if cfg.get(key) is not None}
    if len(set(names.values())) > 1:
        raise ValueError(f"config.json dtype: 'dtype' {names['dtype']!r} and 'torch_dtype' {names['torch_dtype']!r} disagree")
    name = next(iter(names.values()), "float32")
    if name not in DTYPES:
        raise ValueError(f"config.json dtype: expected one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def _read_rope(cfg: dict[str, Any]) -> RopeConfig:
    new = cfg.get("rope_parameters")
    old_scaling = cfg.get("rope_scaling")
    has_old = "rope_theta" in cfg or old_scaling is not None
    if new is not None and not isinstance(new, dict):
        raise ValueError(f"config.json rope_parameters: expected an object, got {new!r}")
    if old_scaling is not None and not isinstance(old_scaling, dict):
        raise ValueError(f"config.json rope_scaling: expected an object or null, got {old_scaling!r}")
    if new is not None:
        rope = _parse_rope(new, "rope_parameters", cfg)
        if has_old:
            old = _parse_rope({"rope_theta": cfg.get("rope_theta", rope.theta), **(old_scaling or {})}, "rope_scaling", cfg)
            if old != rope:
                raise ValueError(f"config.json rope_parameters: {new} disagrees with rope_theta/rope_scaling ({old})")
        return rope
    return _parse_rope({"rope_theta": cfg.get("rope_theta", DEFAULT_ROPE_THETA), **(old_scaling or {})}, "rope_scaling", cfg)


def _parse_rope(params: dict[str, Any], field: str, cfg: dict[str, Any]) -> RopeConfig:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"config.json {field}.rope_type: expected one of {', '.join(SUPPORTED_ROPE_TYPES)}, got {rope_type!r}")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(f"config.json {field}.partial_rotary_factor: expected 1.0, got {params['partial_rotary_factor']}")
    # transformers fills a missing rope_parameters.rope_theta from the top-level key
    theta = float(params.get("rope_theta", cfg.get("rope_theta", DEFAULT_ROPE_THETA)))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    missing = [k for k in ("factor", "low_freq_factor", "high_freq_factor") if k not in params]
    if missing:
        raise ValueError(f"config.json {field}: rope_type 'llama3' needs {', '.join(missing)}")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=float(params["low_freq_factor"]),
        high_freq_factor=float(params["high_freq_factor"]),
        original_max_position_embeddings=int(
            params.get("original_max_position_embeddings", cfg.get("max_position_embeddings", 0))
        ),
    )
