"""Dequantize to a scratch fp16/bf16 W [K, N], then cuBLAS: the large-M candidate.

It writes and re-reads a full-precision copy of W (K*N*2 bytes), so it only wins where the
GEMM is compute-bound and cuBLAS's tile schedule beats the fused kernel; the dispatch table
keeps it only where it measured faster. Also the general path for group sizes the fused
kernels cannot tile (group_size % (32 // bits) != 0) and for fp32 activations.

    program (pid_k, pid_n): W[k, n] = (field(qweight[k // PF, n], k % PF) - z[k // g, n]) * s[k // g, n]
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton.common import cdiv


@triton.jit
def _dequant_kernel(
    qw_ptr, s_ptr, z_ptr, w_ptr,
    N, K, group_size,
    stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_wk, stride_wn,
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr,
):
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    offs_k = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_k[:, None] < K) & (offs_n[None, :] < N)
    w = tl.load(qw_ptr + (offs_k // PF)[:, None] * stride_qk + offs_n[None, :] * stride_qn, mask=mask, other=0)
    q = ((w >> ((offs_k % PF) * BITS)[:, None]) & MASK).to(tl.float32)
    g = offs_k // group_size
    s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=mask, other=0.0).to(tl.float32)
    if HAS_ZEROS:
        z = tl.load(z_ptr + g[:, None] * stride_zg + offs_n[None, :] * stride_zn, mask=mask, other=0.0).to(tl.float32)
    else:
        z = 1 << (BITS - 1)
    out = (q - z) * s
    tl.store(w_ptr + offs_k[:, None] * stride_wk + offs_n[None, :] * stride_wn, out.to(w_ptr.dtype.element_ty), mask=mask)


def dequantize_triton(qw: QuantizedWeight, dtype: torch.dtype, block_k: int = 64, block_n: int = 128) -> Tensor:
    """W [K, N] in `dtype` (rows in perm order, like reference.dequantize)."""
    K, N = qw.in_features, qw.out_features
    w = torch.empty(K, N, dtype=dtype, device=qw.device)
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    _dequant_kernel[(cdiv(K, block_k), cdiv(N, block_n))](
        qw.qweight, qw.scales, zeros, w, N, K, qw.group_size,
        qw.qweight.stride(0), qw.qweight.stride(1), qw.scales.stride(0), qw.scales.stride(1),
        zeros.stride(0), zeros.stride(1), w.stride(0), w.stride(1),
        BITS=qw.bits, HAS_ZEROS=qw.zeros is not None, BLOCK_K=block_k, BLOCK_N=block_n, num_warps=4,
    )
    return w


def quant_dequant_mm(x: Tensor, qw: QuantizedWeight, bias: Tensor | None, *, out: Tensor | None = None) -> Tensor:
    """y = x[:, perm] @ dequantize(W) + bias through a scratch W and torch.matmul (cuBLAS)."""
    w = dequantize_triton(qw, x.dtype)
    xg = x if qw.perm is None else x.index_select(1, qw.perm)
    if bias is None:
        return torch.matmul(xg, w, out=out)
    return torch.addmm(bias.to(x.dtype), xg, w, out=out)
