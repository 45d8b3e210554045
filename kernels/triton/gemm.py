"""Fused dequant + tl.dot GEMM (prefill and batched decode, M >= ~4).

    program (pid -> pid_m, pid_n in GROUP_M-grouped order; pid_k = split) owns y[BM, BN]

    for each K block (BLOCK_K codes = BLOCK_K / PF words per column):
        w  = qweight[kw rows, n]                      int32 [BKW, BN]
        w3 = w[:, None, :] >> (16 if f >= PF/2)      [BKW, PF, BN]   f = field index
        u3 = bits(1.0) | (w3 & MASK<<bf) - 1          q * 2^(bf-23), exact (common.py)
        W  = u3 * (s * 2^(23-bf)) - z * s            = (q - z) * s in fp32, one FFMA
        W  = reshape(W, [BLOCK_K, BN]).to(x.dtype)    row kw*PF + f == code k: the packed order
        a  = x[m, perm[k]]                            [BM, BLOCK_K] (act-order gather, no extra launch)
        acc = tl.dot(a, W, acc)                       fp32 accumulate

    epilogue: + bias, or the split-K fixup (common.store_tile)

Scales: SCALE_ALIGNED (group_size % BLOCK_K == 0 or one group) loads one row per block,
otherwise one per word row (group_size % PF == 0, checked by the dispatcher).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton.common import MAGIC_ONE, cdiv, plan_split_k, store_tile


@triton.jit
def _load_x_perm(x_ptr, perm_ptr, offs_m, mask_m, k, k_hi, stride_xm, stride_xk, stride_pk):
    """x[m, perm[k]] for a [BLOCK_M] x [BLOCK_K] tile; 0 where k >= k_hi."""
    mask_k = k < k_hi
    kx = tl.load(perm_ptr + k * stride_pk, mask=mask_k, other=0)
    return tl.load(x_ptr + offs_m[:, None] * stride_xm + kx[None, :] * stride_xk, mask=mask_m[:, None] & mask_k[None, :], other=0.0)


@triton.jit
def _gemm_kernel(
    # pointers
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, y_ptr, ws_ptr, lock_ptr,
    # sizes
    M, N, K, group_size, k_per_split, split_k,
    # strides
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
    stride_ym, stride_yn, magic,
    # meta
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALE_ALIGNED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr, USE_SPLIT: tl.constexpr,
):
    PF: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PF // 2
    MASK: tl.constexpr = (1 << BITS) - 1
    BLOCK_KW: tl.constexpr = BLOCK_K // PF
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_in_group = GROUP_M * num_pid_n
    first_m = (pid // num_in_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % num_in_group) % group_rows
    pid_n = (pid % num_in_group) // group_rows

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kw = tl.arange(0, BLOCK_KW)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N
    num_rows = (K + PF - 1) // PF
    num_groups = (K + group_size - 1) // group_size

    f3 = tl.arange(0, PF)[None, :, None]  # [1, PF, 1]
    hi3 = (f3 >= HALF).to(tl.int32) * 16
    bf3 = (f3 % HALF) * BITS
    mask3 = MASK << bf3
    pow3 = (1 << (23 - bf3)).to(tl.float32)

    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if HAS_PERM:
        # act-order: the gathered activations are 2-byte loads, which the pipeliner cannot turn
        # into cp.async, so they are fetched one K step ahead by hand (register double buffer)
        a_next = _load_x_perm(x_ptr, perm_ptr, offs_m, mask_m, k_lo + offs_k, k_hi, stride_xm, stride_xk, stride_pk)
    for k_off in range(0, k_per_split, BLOCK_K):
        kb = k_lo + k_off
        if HAS_PERM:
            a = a_next
            a_next = _load_x_perm(
                x_ptr, perm_ptr, offs_m, mask_m, kb + BLOCK_K + offs_k, k_hi, stride_xm, stride_xk, stride_pk
            )
        rows = kb // PF + offs_kw
        w = tl.load(
            qw_ptr + rows[:, None] * stride_qk + offs_n[None, :] * stride_qn,
            mask=(rows[:, None] < num_rows) & mask_n[None, :], other=0,
        )
        u3 = (((w[:, None, :] >> hi3) & mask3) | magic).to(tl.float32, bitcast=True) - 1.0
        if SCALE_ALIGNED:
            g = tl.minimum(kb // group_size, num_groups - 1)  # past K in a short last split: x is 0 there
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=mask_n, other=0.0).to(tl.float32)
            else:
                z = tl.full((BLOCK_N,), 1 << (BITS - 1), tl.float32)
            w3 = u3 * (pow3 * s[None, None, :]) - (z * s)[None, None, :]
        else:
            g = (kb + offs_kw * PF) // group_size
            sz_mask = (g[:, None] < num_groups) & mask_n[None, :]
            s = tl.load(s_ptr + g[:, None] * stride_sg + offs_n[None, :] * stride_sn, mask=sz_mask, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(
                    z_ptr + g[:, None] * stride_zg + offs_n[None, :] * stride_zn, mask=sz_mask, other=0.0
                ).to(tl.float32)
            else:
                z = tl.full((BLOCK_KW, BLOCK_N), 1 << (BITS - 1), tl.float32)
            w3 = u3 * (pow3 * s[:, None, :]) - (z * s)[:, None, :]
        b = tl.reshape(w3, (BLOCK_K, BLOCK_N)).to(x_ptr.dtype.element_ty)
        if not HAS_PERM:
            k = kb + offs_k
            a = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
                mask=mask_m[:, None] & (k < k_hi)[None, :], other=0.0,
            )
        acc = tl.dot(a, b, acc)
    store_tile(
        acc, offs_m, offs_n, M, N, y_ptr, stride_ym, stride_yn, bias_ptr, ws_ptr, lock_ptr,
        pid_k, pid, split_k, HAS_BIAS, USE_SPLIT,
    )


def gemm_supported(qw: QuantizedWeight, block_k: int) -> bool:
    pf = 32 // qw.bits
    g, K = qw.group_size, qw.in_features
    return block_k % pf == 0 and block_k >= 16 and (g >= K or g % block_k == 0 or g % pf == 0)


def quant_gemm(
    x: Tensor, qw: QuantizedWeight, bias: Tensor | None, *,
    block_m: int, block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
    group_m: int = 8, out: Tensor | None = None,
) -> Tensor:
    """y [M, N] = x[:, perm] @ W + bias for x [M, K] fp16/bf16 (2-D, any strides).

    qweight [ceil(K*b/32), N] int32 | scales, zeros [G, N] | perm [K] int32 | bias [N]
    """
    M, K = x.shape
    N = qw.out_features
    assert K == qw.in_features and gemm_supported(qw, block_k)
    assert x.dtype in (torch.float16, torch.bfloat16)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    num_tiles = cdiv(M, block_m) * cdiv(N, block_n)
    k_per_split, split_k, ws, locks = plan_split_k(K, split_k, block_k, num_tiles, y)
    aligned = qw.group_size >= K or qw.group_size % block_k == 0
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    perm = qw.perm if qw.perm is not None else qw.qweight
    _gemm_kernel[(num_tiles, split_k)](
        x, qw.qweight, qw.scales, zeros, perm, bias if bias is not None else y, y, ws, locks,
        M, N, K, qw.group_size, k_per_split, split_k,
        x.stride(0), x.stride(1), qw.qweight.stride(0), qw.qweight.stride(1),
        qw.scales.stride(0), qw.scales.stride(1), zeros.stride(0), zeros.stride(1), perm.stride(0),
        y.stride(0), y.stride(1), MAGIC_ONE,
        BITS=qw.bits, HAS_ZEROS=qw.zeros is not None, HAS_PERM=qw.perm is not None, HAS_BIAS=bias is not None,
        SCALE_ALIGNED=aligned, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m,
        USE_SPLIT=split_k > 1, num_warps=num_warps, num_stages=num_stages,
    )
    return y
