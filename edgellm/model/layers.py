"""Building blocks of the Llama family: RMSNorm, RotaryEmbedding, QuantLinear, Attention, MLP.

Parameter names are Hugging Face's, so a checkpoint tensor's name is its module path.
Modules are built on the meta device and filled by the loader through `load_dense` /
`load_quantized`; the math is `edgellm.kernels.reference` and `quant_matmul`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from edgellm.kernels import reference
from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.quant_matmul import quant_matmul
from edgellm.model.config import ModelConfig, RopeConfig
from edgellm.model.forward_context import ForwardContext

DEQUANT_BLOCK_N = 1024  # output columns dequantized at a time when caching a CPU weight


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return reference.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """cos/sin [T, D] for explicit positions, computed in fp32 as transformers does, cast to x's dtype."""

    def __init__(self, rope: RopeConfig, head_dim: int) -> None:
        super().__init__()
        # Built on the CPU even inside a meta-device context: inv_freq is derived from the
        # config, not loaded, so it must hold real values. Non-persistent: not a checkpoint tensor.
        with torch.device("cpu"):
            inv_freq = rope.inv_freq(head_dim)  # [D / 2] fp32
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        freqs = positions[..., None].float() * self.inv_freq.float()  # [T, D / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


class QuantLinear(nn.Module):
    """A Linear whose weight is a `QuantizedWeight`, or a dense [N, K] tensor for layers the
    checkpoint leaves unquantized. The checkpoint decides which, at load time.

    CPU backend: `load_quantized(qw, cache_dtype)` dequantizes once into `weight` (natural K
    order, the compute dtype) and runs `F.linear`; dequantizing on every forward costs far
    more than the matmul itself (docs/loading.md has the numbers). `qweight` is kept either
    way: it is what a GPU kernel or a device move needs.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight: nn.Parameter | None = nn.Parameter(torch.empty(out_features, in_features), requires_grad=False)
        self.bias: nn.Parameter | None = nn.Parameter(torch.empty(out_features), requires_grad=False) if bias else None
        self.qweight: QuantizedWeight | None = None

    def load_dense(self, weight: Tensor) -> None:
        self.weight = nn.Parameter(weight, requires_grad=False)  # [N, K]

    def load_quantized(self, qw: QuantizedWeight, cache_dtype: torch.dtype | None) -> None:
        """Hold `qw`; with `cache_dtype`, also keep its dequantized [N, K] weight in that dtype."""
        self.qweight = qw
        if cache_dtype is None:
            self.weight = None
            return
        weight = torch.empty(qw.out_features, qw.in_features, dtype=cache_dtype, device=qw.device)  # [N, K]
        # Column blocks bound the fp32/int64 temporaries of `dequantize` to a few hundred MB
        # even for 14336-wide layers; each block is exact, so the result equals one big call.
        for n0 in range(0, qw.out_features, DEQUANT_BLOCK_N):
            block = _columns(qw, n0, n0 + DEQUANT_BLOCK_N)
            w = reference.dequantize(block, torch.float32).t()  # [n, K], K in perm order
            if qw.perm is not None:
                weight[n0 : n0 + w.shape[0], qw.perm.long()] = w.to(cache_dtype)  # back to natural K order
            else:
                weight[n0 : n0 + w.shape[0]] = w
        self.weight = nn.Parameter(weight, requires_grad=False)

    def load_bias(self, bias: Tensor) -> None:
        self.bias = nn.Parameter(bias, requires_grad=False)

    def forward(self, x: Tensor) -> Tensor:
        if self.weight is not None:
            return F.linear(x, self.weight, self.bias)
        return quant_matmul(x, self.qweight, self.bias)

    def extra_repr(self) -> str:
        kind = "dense" if self.qweight is None else f"{self.qweight.bits}-bit g{self.qweight.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, {kind}"


def _columns(qw: QuantizedWeight, n0: int, n1: int) -> QuantizedWeight:
    """Output columns [n0, n1) of `qw`: every tensor but `perm` is column-major in N."""
    return QuantizedWeight(
        qweight=qw.qweight[:, n0:n1],
        scales=qw.scales[:, n0:n1],
        zeros=None if qw.zeros is None else qw.zeros[:, n0:n1],
        bits=qw.bits,
        group_size=qw.group_size,
        perm=qw.perm,
        in_features=qw.in_features,
    )


class Attention(nn.Module):
    """Self-attention as four steps, each a method, so a KV-cache path can replace `attend`:

        project_qkv(x) -> q, k, v        [..., T, H, D]   (+ Qwen3 per-head q/k norm)
        rotate(q, k, positions)          RoPE at the given positions
        attend(q, k, v)                  plain causal attention, no cache
          or attend_paged(q, k, v, ...)  flat batch: write K/V to the paged cache, attend through it
        o_proj(o.flatten(-2))
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.num_heads = c.num_heads
        self.num_kv_heads = c.num_kv_heads
        self.head_dim = c.head_dim
        self.scale = c.head_dim**-0.5
        self.q_proj = QuantLinear(c.hidden_size, c.num_heads * c.head_dim, c.qkv_bias)
        self.k_proj = QuantLinear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias)
        self.v_proj = QuantLinear(c.hidden_size, c.num_kv_heads * c.head_dim, c.qkv_bias)
        self.o_proj = QuantLinear(c.num_heads * c.head_dim, c.hidden_size, c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.rotary = RotaryEmbedding(c.rope, c.head_dim)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)  # [..., T, Hq, D]
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # [..., T, Hkv, D]
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)  # [..., T, Hkv, D]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return q, k, v

    def rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.rotary(positions, q.dtype)  # [T, D]
        return reference.apply_rotary(q, cos, sin), reference.apply_rotary(k, cos, sin)

    def attend(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return reference.causal_attention(q, k, v, self.scale)  # [B, T, Hq, D]

    def attend_paged(self, q: Tensor, k: Tensor, v: Tensor, ctx: ForwardContext, kv_cache: Tensor) -> Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D]; kv_cache [2, num_blocks, block_size, Hkv, D] of this layer."""
        ctx.plan.write(kv_cache[0], kv_cache[1], k, v)
        return ctx.plan.attend(q, kv_cache[0], kv_cache[1], self.scale)  # [T, Hq, D]

    def forward(
        self, x: Tensor, positions: Tensor, ctx: ForwardContext | None = None, kv_cache: Tensor | None = None
    ) -> Tensor:
        q, k, v = self.project_qkv(x)
        q, k = self.rotate(q, k, positions)
        o = self.attend(q, k, v) if ctx is None else self.attend_paged(q, k, v, ctx, kv_cache)
        return self.o_proj(o.flatten(-2))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = config
        self.gate_proj = QuantLinear(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.up_proj = QuantLinear(c.hidden_size, c.intermediate_size, c.mlp_bias)
        self.down_proj = QuantLinear(c.intermediate_size, c.hidden_size, c.mlp_bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(reference.silu_mul(self.gate_proj(x), self.up_proj(x)))
