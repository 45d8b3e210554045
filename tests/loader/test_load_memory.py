"""Streaming load: peak anonymous memory stays near the final model size.

A naive loader (read the whole file, then cast) holds the checkpoint and the model at once;
ours holds the model plus one tensor in flight. The model is a random fp16 Llama of ~240 MB,
loaded in fp32 (~480 MB of parameters) in a fresh subprocess that samples RssAnon every
0.2 ms. The bound is on peak minus the RssAnon before loading, against the parameters' own
bytes: the allocator may keep freed buffers, so "RssAnon after" alone would hide a naive
loader's second copy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

MIB = 2**20
MARGIN_BYTES = 48 * MIB  # allocator slack, Python objects, the sampler thread
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 5,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "tie_word_embeddings": False,
    "dtype": "float16",
}

PROBE = r"""
import json, sys, threading, time
import torch
from edgellm import load_model

def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")

peak = 0
done = threading.Event()

def sample() -> None:
    global peak
    while not done.is_set():
        peak = max(peak, rss_anon())
        time.sleep(0.0002)

before = rss_anon()
thread = threading.Thread(target=sample)
thread.start()
model = load_model(sys.argv[1], dtype=torch.float32)
done.set()
thread.join()
after = rss_anon()
param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"before": before, "peak": max(peak, after), "after": after, "param_bytes": param_bytes}))
"""


def _write_random_llama(model_dir: Path) -> int:
    """Write the checkpoint; return the largest tensor's size in the compute dtype (fp32)."""
    c = CONFIG
    h, i, kv = c["hidden_size"], c["intermediate_size"], c["num_key_value_heads"] * (c["hidden_size"] // c["num_attention_heads"])
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,), "lm_head.weight": (c["vocab_size"], h)}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
            p + "mlp.gate_proj.weight": (i, h), p + "mlp.up_proj.weight": (i, h), p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        }
    g = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(shape, generator=g, dtype=torch.float16) for name, shape in shapes.items()}
    save_file(tensors, model_dir / "model.safetensors", metadata={"format": "pt"})
    (model_dir / "config.json").write_text(json.dumps(CONFIG))
    return max(t.numel() for t in tensors.values()) * 4


@pytest.mark.slow
def test_peak_anonymous_memory_is_final_size_plus_one_tensor(tmp_path: Path) -> None:
    if not Path("/proc/self/status").is_file():
        pytest.skip("needs Linux /proc")
    largest = _write_random_llama(tmp_path)
    checkpoint_bytes = (tmp_path / "model.safetensors").stat().st_size
    assert checkpoint_bytes > 200 * MIB
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], capture_output=True, text=True, check=True, timeout=120)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    assert m["after"] - m["before"] >= 0.95 * m["param_bytes"], m  # the model really is resident
    extra = m["peak"] - m["before"] - m["param_bytes"]
    assert extra <= largest + MARGIN_BYTES, (
        f"peak RssAnon grew {(m['peak'] - m['before']) / MIB:.0f} MiB for {m['param_bytes'] / MIB:.0f} MiB of parameters "
        f"({extra / MIB:.0f} MiB extra); allowed: largest tensor {largest / MIB:.0f} MiB + {MARGIN_BYTES / MIB:.0f} MiB"
    )
