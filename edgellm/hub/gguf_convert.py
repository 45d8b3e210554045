"""GGUF (llama architecture) -> fp16 Hugging Face checkpoint directory.

What `edgellm pull` runs on a GGUF file (formats.md §5). It owns three things:

* weights: every tensor is dequantized with gguf-py's own `gguf.quants.dequantize`
  (fp32 out, the `d`/`m` block scales widened from fp16) and rounded once to fp16, so
  the result is bit-identical to what gguf-py, llama.cpp's reference decoder in Python,
  produces; GGUF names are mapped to HF names and Q/K rows are un-permuted (below);
* config.json / generation_config.json: written here from the GGUF metadata keys
  (formats.md §5.3), so the architecture numbers edgellm's loader reads come from one
  short, reviewable table rather than from a library's internals;
* tokenizer.json / tokenizer_config.json (with the chat template): built by
  transformers' own GGUF tokenizer conversion (`AutoTokenizer.from_pretrained(dir,
  gguf_file=...)`). Rebuilding a byte-level BPE tokenizer from `tokenizer.ggml.*`
  (pre-tokenizer regex per `tokenizer.ggml.pre`, special-token flags, merges) is
  exactly what that code already does and keeps up to date; a copy here would only
  drift from it.

Rotary permutation (formats.md §5.4, T20). llama.cpp's converter reorders the rows of
each Q/K head from HF's rotate-half layout to adjacent pairs:

    HF   rows of one head:  [x0 x1 ... x31 | y0 y1 ... y31]     (dim i pairs with i + hd/2)
    GGUF rows of one head:  [x0 y0 x1 y1 ... x31 y31]           (dim 2i pairs with 2i + 1)

The inverse reshapes rows as (H, hd/2, 2), swaps the last two axes and flattens; H is
`num_attention_heads` for attn_q and `num_key_value_heads` for attn_k.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize
from safetensors.torch import save_file

logger = logging.getLogger(__name__)

# Tensor types a llama-family "Q4_x / Q5_x / Q8_0" file holds (formats.md §5.1);
# anything else (k-quants, i-quants) is refused rather than trusted untested.
SUPPORTED_TYPES = frozenset(
    {
        GGMLQuantizationType.F32,
        GGMLQuantizationType.F16,
        GGMLQuantizationType.Q4_0,
        GGMLQuantizationType.Q4_1,
        GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1,
        GGMLQuantizationType.Q8_0,
    }
)

GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
LAYER_TENSORS = {  # blk.{i}.<key> -> model.layers.{i}.<value>
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

FP16_MAX = float(np.finfo(np.float16).max)


def unpermute_rotary(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation: GGUF adjacent-pair rows -> HF rotate-half rows.

    `weight` is [H * hd, ...] (a 2-D weight or a 1-D bias); rows are moved whole, so
    this commutes with dequantization.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise ValueError(f"rotary un-permute: expected rows divisible by 2 * {num_heads} heads, got {rows}")
    head_dim = rows // num_heads
    return weight.reshape(num_heads, head_dim // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def convert_gguf_to_hf(gguf_path: Path, out_dir: Path) -> None:
    """Write model.safetensors, config.json, generation_config.json and the tokenizer files
    for the llama-architecture GGUF `gguf_path` into the existing directory `out_dir`."""
    reader = GGUFReader(gguf_path)
    config = read_llama_config(reader, gguf_path)
    state_dict = dequantize_state_dict(reader, config, gguf_path)
    save_file(state_dict, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_tokenizer(gguf_path, out_dir)


def read_llama_config(reader: GGUFReader, gguf_path: Path) -> dict[str, Any]:
    """config.json for LlamaForCausalLM from the GGUF metadata (formats.md §5.3), in
    transformers 5 spelling (`rope_parameters`, `dtype`) like the installed transformers writes."""
    arch = _metadata(reader, gguf_path, "general.architecture")
    if arch != "llama":
        raise ValueError(f"{gguf_path.name}: general.architecture: expected 'llama', got {arch!r}")
    hidden = _metadata(reader, gguf_path, "llama.embedding_length")
    heads = _metadata(reader, gguf_path, "llama.attention.head_count")
    embd = _find_tensor(reader, gguf_path, "token_embd.weight")
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    config: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": _metadata(reader, gguf_path, "llama.feed_forward_length"),
        "num_hidden_layers": _metadata(reader, gguf_path, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": _metadata(reader, gguf_path, "llama.attention.head_count_kv", default=heads),
        "head_dim": _metadata(reader, gguf_path, "llama.rope.dimension_count", default=hidden // heads),
        "hidden_act": "silu",
        "rms_norm_eps": _float32_value(_metadata(reader, gguf_path, "llama.attention.layer_norm_rms_epsilon")),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": _float32_value(_metadata(reader, gguf_path, "llama.rope.freq_base", default=10000.0)),
        },
        "max_position_embeddings": _metadata(reader, gguf_path, "llama.context_length"),
        "vocab_size": int(embd.shape[1]),  # ne = [hidden, vocab]: rows of the embedding
        "tie_word_embeddings": not has_output,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": _metadata(reader, gguf_path, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _metadata(reader, gguf_path, "tokenizer.ggml.eos_token_id"),
        "dtype": "float16",
    }
    pad = _metadata(reader, gguf_path, "tokenizer.ggml.padding_token_id", default=None)
    if pad is not None:
        config["pad_token_id"] = pad
    if _metadata(reader, gguf_path, "llama.rope.scaling.type", default=None) is not None:
        raise ValueError(f"{gguf_path.name}: llama.rope.scaling.type: expected none (plain RoPE), got a scaled RoPE")
    return config


def dequantize_state_dict(reader: GGUFReader, config: dict[str, Any], gguf_path: Path) -> dict[str, torch.Tensor]:
    """HF-named fp16 tensors: dequantized in fp32 by gguf-py, Q/K un-permuted, rounded once to fp16."""
    state_dict: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, gguf_path)
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ValueError(
                f"{gguf_path.name}: {tensor.name}: expected one of "
                f"{', '.join(t.name for t in sorted(SUPPORTED_TYPES))}, got {tensor.tensor_type.name}"
            )
        shape = tuple(int(n) for n in reversed(tensor.shape))  # gguf lists ne fastest-first; HF is [N, K]
        weight = dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        if tensor.name.endswith("attn_q.weight"):
            weight = unpermute_rotary(weight, config["num_attention_heads"])
        elif tensor.name.endswith("attn_k.weight"):
            weight = unpermute_rotary(weight, config["num_key_value_heads"])
        peak = float(np.abs(weight).max())
        if not peak <= FP16_MAX:  # also catches NaN
            raise ValueError(f"{gguf_path.name}: {tensor.name}: expected |values| <= {FP16_MAX:g} to fit fp16, got {peak:g}")
        state_dict[name] = torch.from_numpy(weight.astype(np.float16))
    return state_dict


def hf_tensor_name(gguf_name: str, gguf_path: Path) -> str:
    """The HF name of a llama GGUF tensor (formats.md §5.3); unknown names are refused."""
    if gguf_name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}"
    raise ValueError(f"{gguf_path.name}: tensor {gguf_name!r}: expected a llama tensor name (formats.md §5.3), got an unknown one")


def save_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """tokenizer.json + tokenizer_config.json (chat template inside) via transformers' GGUF
    tokenizer conversion; see the module docstring for why it is reused, not rewritten."""
    from transformers import AutoTokenizer  # heavy import, only needed while converting

    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    # save_jinja_files=False keeps the chat template inside tokenizer_config.json, where
    # every reader (transformers 4 and 5, plain-JSON readers) looks for it.
    tokenizer.save_pretrained(out_dir, save_jinja_files=False)


_REQUIRED = object()


def _metadata(reader: GGUFReader, gguf_path: Path, key: str, default: Any = _REQUIRED) -> Any:
    field = reader.get_field(key)
    if field is None:
        if default is not _REQUIRED:
            return default
        raise ValueError(f"{gguf_path.name}: metadata key {key}: expected present, got missing")
    return field.contents()


def _float32_value(value: float) -> float:
    """GGUF stores floats as float32 (1e-5 reads back as 9.99999974e-06): keep the shortest
    decimal that rounds to the same float32, i.e. the value the model was configured with."""
    return float(str(np.float32(value)))


def _find_tensor(reader: GGUFReader, gguf_path: Path, name: str) -> ReaderTensor:
    for tensor in reader.tensors:
        if tensor.name == name:
            return tensor
    raise ValueError(f"{gguf_path.name}: tensor {name}: expected present, got missing")
