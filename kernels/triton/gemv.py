"""GEMV / few-row kernels (decode, M <= ~8): no tensor cores, every packed word read once.

Two layouts of the same algorithm: `_gemv1_kernel` (M == 1) keeps [BLOCK_KW, BLOCK_N] tiles in
the load's layout (16-byte loads along N, no shared-memory round trip; ~7.6 SASS instructions
per code at 4-bit, measured from the cubin); `_gemv_kernel` (BLOCK_M > 1) keeps
[BLOCK_M, BLOCK_N, BLOCK_KW] tiles so each thread owns one word row and converts each
activation once per row (Triton's layout for it round-trips the decoded fields through
shared memory, so it only pays off when several rows share the decode).

    program (pid_n, pid_k, pid_m) owns y[m-block, n-block] for K range [k_lo, k_hi) of its split

    for each K block (BLOCK_KW words per column = BLOCK_KW * PF codes):
        w      = qweight[kw rows, n cols]                  int32, held as [BLOCK_N, BLOCK_KW]
        for field f in 0..PF-1 (unrolled; codes k = kb + kw*PF + f):
            x_f = x[m, perm[k]]                            [BLOCK_M, BLOCK_KW] (perm: act-order gather)
            u_f = bits(1.0) | (w & MASK<<bf) - 1           q * 2^(bf-23), exact (see common.py)
            t  += (x_f * 2^(23-bf)) * u_f                  [BLOCK_M, BLOCK_N, BLOCK_KW]  = sum x*q
            xs += x_f                                      sum x
        acc += s * t - (z * s) * xs                        scales once per word row, not per code

    y = sum(acc over KW) (+ bias), or the split-K fixup (common.store_tile)

Scales: SCALE_ALIGNED (group_size % BLOCK_K == 0 or one group) loads one scale row per block;
otherwise one per word row, which needs group_size % PF == 0 (the dispatcher checks).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton.common import MAGIC_ONE, cdiv, plan_split_k, store_tile


@triton.jit
def _gemv_kernel(
    # pointers
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, y_ptr, ws_ptr, lock_ptr,
    # sizes
    M, N, K, group_size, k_per_split, split_k,
    # strides
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
    stride_ym, stride_yn, magic,
    # meta
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALE_ALIGNED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
    USE_SPLIT: tl.constexpr,
):
    PF: tl.constexpr = 32 // BITS
    HALF: tl.constexpr = PF // 2
    MASK: tl.constexpr = (1 << BITS) - 1
    BLOCK_K: tl.constexpr = BLOCK_KW * PF
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    num_pid_n = tl.num_programs(0)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kw = tl.arange(0, BLOCK_KW)
    mask_m = offs_m < M
    mask_n = offs_n < N
    num_rows = (K + PF - 1) // PF
    num_groups = (K + group_size - 1) // group_size

    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    # Tiles are [BLOCK_M, BLOCK_N, BLOCK_KW]: Triton's default layout spreads threads over the
    # last dim, so each thread owns one word row and BLOCK_N / 8 columns, and loads and converts
    # each activation once per word row instead of once per code (3 ALU ops per code, not ~15).
    acc = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_KW), dtype=tl.float32)
    for k_off in range(0, k_per_split, BLOCK_K):
        kb = k_lo + k_off
        rows = kb // PF + offs_kw
        w = tl.load(
            qw_ptr + rows[None, :] * stride_qk + offs_n[:, None] * stride_qn,
            mask=(rows[None, :] < num_rows) & mask_n[:, None], other=0,
        )  # [BLOCK_N, BLOCK_KW]
        w_hi = w >> 16
        t = tl.zeros((BLOCK_M, BLOCK_N, BLOCK_KW), dtype=tl.float32)
        xs = tl.zeros((BLOCK_M, BLOCK_KW), dtype=tl.float32)
        for f in tl.static_range(PF):
            k = kb + offs_kw * PF + f
            mask_k = k < k_hi
            if HAS_PERM:
                kx = tl.load(perm_ptr + k * stride_pk, mask=mask_k, other=0)
            else:
                kx = k
            x_f = tl.load(
                x_ptr + offs_m[:, None] * stride_xm + kx[None, :] * stride_xk,
                mask=mask_m[:, None] & mask_k[None, :], other=0.0,
            ).to(tl.float32)  # [BLOCK_M, BLOCK_KW]
            bf = (f % HALF) * BITS  # constexpr: f is a static_range index
            if f < HALF:
                base = w
            else:
                base = w_hi
            u = ((base & (MASK << bf)) | magic).to(tl.float32, bitcast=True) - 1.0
            t += (x_f * (1 << (23 - bf)))[:, None, :] * u[None, :, :]
            xs += x_f
        if SCALE_ALIGNED:
            g = tl.minimum(kb // group_size, num_groups - 1)  # past K in a short last split: x is 0 there
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=mask_n, other=0.0).to(tl.float32)
            else:
                z = tl.full((BLOCK_N,), 1 << (BITS - 1), tl.float32)
            acc += s[None, :, None] * t - (z * s)[None, :, None] * xs[:, None, :]
        else:
            g = (kb + offs_kw * PF) // group_size
            sz_mask = (g[None, :] < num_groups) & mask_n[:, None]
            s = tl.load(s_ptr + g[None, :] * stride_sg + offs_n[:, None] * stride_sn, mask=sz_mask, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(
                    z_ptr + g[None, :] * stride_zg + offs_n[:, None] * stride_zn, mask=sz_mask, other=0.0
                ).to(tl.float32)
            else:
                z = tl.full((BLOCK_N, BLOCK_KW), 1 << (BITS - 1), tl.float32)
            acc += s[None, :, :] * t - (z * s)[None, :, :] * xs[:, None, :]
    y = tl.sum(acc, axis=2)  # [BLOCK_M, BLOCK_N]
    store_tile(
        y, offs_m, offs_n, M, N, y_ptr, stride_ym, stride_yn, bias_ptr, ws_ptr, lock_ptr,
        pid_k, pid_m * num_pid_n + pid_n, split_k, HAS_BIAS, USE_SPLIT,
    )


@triton.jit
def _gemv1_kernel(  # M == 1
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, y_ptr, ws_ptr, lock_ptr,
    M, N, K, group_size, k_per_split, split_k,
    stride_xm, stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
    stride_ym, stride_yn, magic,
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALE_ALIGNED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr,
    USE_SPLIT: tl.constexpr,
):
    PF: tl.constexpr = 32 // BITS
    MASK: tl.constexpr = (1 << BITS) - 1
    BLOCK_K: tl.constexpr = BLOCK_KW * PF
    TOP: tl.constexpr = 23 - BITS
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_kw = tl.arange(0, BLOCK_KW)
    mask_n = offs_n < N
    num_rows = (K + PF - 1) // PF
    num_groups = (K + group_size - 1) // group_size
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    # [BLOCK_KW, BLOCK_N] tiles in the load's own layout (16 B per thread along N): no layout
    # conversion inside the loop; each activation is loaded once per 4 columns.
    acc = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
    for k_off in range(0, k_per_split, BLOCK_K):
        kb = k_lo + k_off
        rows = kb // PF + offs_kw
        w = tl.load(qw_ptr + rows[:, None] * stride_qk + offs_n[None, :] * stride_qn,
                    mask=(rows[:, None] < num_rows) & mask_n[None, :], other=0)
        t = tl.zeros((BLOCK_KW, BLOCK_N), dtype=tl.float32)
        xs = tl.zeros((BLOCK_KW,), dtype=tl.float32)
        k_row = kb + offs_kw * PF  # first code of each word row
        x_row = x_ptr + k_row * stride_xk  # fields are constant offsets from here (no perm)
        for f in tl.static_range(PF):
            mask_k = k_row + f < k_hi
            if HAS_PERM:
                kx = tl.load(perm_ptr + (k_row + f) * stride_pk, mask=mask_k, other=0)
                x_f = tl.load(x_ptr + kx * stride_xk, mask=mask_k, other=0.0).to(tl.float32)
            else:
                x_f = tl.load(x_row + f * stride_xk, mask=mask_k, other=0.0).to(tl.float32)
            # field f -> mantissa bits [23-BITS, 23): one shift, one LOP3 (magic is a register)
            if TOP - f * BITS >= 0:
                moved = w << (TOP - f * BITS)
            else:
                moved = w >> (f * BITS - TOP)
            v = ((moved & (MASK << TOP)) | magic).to(tl.float32, bitcast=True)  # 1 + q / 2^BITS
            t += x_f[:, None] * v
            xs += x_f
        d = t - xs[:, None]  # sum x * q / 2^BITS
        if SCALE_ALIGNED:
            g = tl.minimum(kb // group_size, num_groups - 1)  # past K in a short last split: x is 0 there
            s = tl.load(s_ptr + g * stride_sg + offs_n * stride_sn, mask=mask_n, other=0.0).to(tl.float32)
            if HAS_ZEROS:
                z = tl.load(z_ptr + g * stride_zg + offs_n * stride_zn, mask=mask_n, other=0.0).to(tl.float32)
            else:
                z = tl.full((BLOCK_N,), 1 << (BITS - 1), tl.float32)
            acc += (s * (1 << BITS))[None, :] * d - (z * s)[None, :] * xs[:, None]
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
            acc += (s * (1 << BITS)) * d - (z * s) * xs[:, None]
    y = tl.sum(acc, axis=0)[None, :]  # [1, BLOCK_N]
    offs_m = tl.arange(0, 1)
    store_tile(y, offs_m, offs_n, M, N, y_ptr, stride_ym, stride_yn, bias_ptr, ws_ptr, lock_ptr,
               pid_k, pid_n, split_k, HAS_BIAS, USE_SPLIT)


def gemv_supported(qw: QuantizedWeight, block_k: int) -> bool:
    """Per-word-row scales need whole words per group; one group or aligned blocks always work."""
    pf = 32 // qw.bits
    g, K = qw.group_size, qw.in_features
    return g >= K or g % block_k == 0 or g % pf == 0


def quant_gemv(
    x: Tensor, qw: QuantizedWeight, bias: Tensor | None, *,
    block_m: int, block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
    out: Tensor | None = None,
) -> Tensor:
    """y [M, N] = x[:, perm] @ W + bias for x [M, K] (2-D, any strides).

    qweight [ceil(K*b/32), N] int32 | scales, zeros [G, N] | perm [K] int32 | bias [N]
    block_k counts codes (a multiple of 32 // bits); K ranges of a split are block_k aligned.
    """
    M, K = x.shape
    N = qw.out_features
    pf = 32 // qw.bits
    assert K == qw.in_features and block_k % pf == 0 and gemv_supported(qw, block_k)
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    num_pid_n, num_pid_m = cdiv(N, block_n), cdiv(M, block_m)
    k_per_split, split_k, ws, locks = plan_split_k(K, split_k, block_k, num_pid_n * num_pid_m, y)
    aligned = qw.group_size >= K or qw.group_size % block_k == 0
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    perm = qw.perm if qw.perm is not None else qw.qweight
    kernel = _gemv1_kernel if block_m == 1 else _gemv_kernel
    kernel[(num_pid_n, split_k, num_pid_m)](
        x, qw.qweight, qw.scales, zeros, perm, bias if bias is not None else y, y, ws, locks,
        M, N, K, qw.group_size, k_per_split, split_k,
        x.stride(0), x.stride(1), qw.qweight.stride(0), qw.qweight.stride(1),
        qw.scales.stride(0), qw.scales.stride(1), zeros.stride(0), zeros.stride(1), perm.stride(0),
        y.stride(0), y.stride(1), MAGIC_ONE,
        BITS=qw.bits, HAS_ZEROS=qw.zeros is not None, HAS_PERM=qw.perm is not None, HAS_BIAS=bias is not None,
        SCALE_ALIGNED=aligned, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_KW=block_k // pf, USE_SPLIT=split_k > 1,
        num_warps=num_warps, num_stages=num_stages,
    )
    return y
