"""M = 1 GEMV for fp16 activations with packed fp16x2 math: 2.5-2.8 SASS instructions per 4-bit code.

The fp32 GEMV (gemv.py) spends 6.0 instructions per code (one shift, one LOP3, one FFMA per code
plus activation handling). Here the inner product of one packed word with its 8 activations is ONE
`tl.inline_asm_elementwise` call (the exllama / Marlin trick, in PTX):

    a = (w      & 0x000F000F) | 0x64006400     fp16x2 (1024 + q0,      1024 + q4)        LOP3
    b = (w      & 0x00F000F0) | 0x64006400     fp16x2 (1024 + 16 q1,   1024 + 16 q5)     LOP3
    c = (w >> 8 & 0x000F000F) | 0x64006400     (1024 + q2,  1024 + q6)                    SHF + LOP3
    d = (w >> 8 & 0x00F000F0) | 0x64006400     (1024 + 16 q3, 1024 + 16 q7)               LOP3
    a -= 1032, c -= 1032  ->  q - 8  exact;   b -= 1152, d -= 1152  ->  16 (q - 8)  exact  HADD2 x4
    h = a * (x0, x4) + b * (x1, x5)/16 + c * (x2, x6) + d * (x3, x7)/16                 HMUL2 + HFMA2 x3
    t = float(h.lo + h.hi)  =  sum_j x_j (q_j - 8)                                        HADD2 + cvt
    acc += s * t                                                                          FFMA

i.e. 16 instructions per word of 8 codes. Only these 8 products are summed in fp16 (4 per lane, then
the lane sum; 3-4e-4 relative error per layer, emulated and measured); everything after is fp32. The
activation pairs (fp16x2 registers, x1/x5 and x3/x7 pre-divided by 16, exact) are built once per word
row per thread (PRMT from int32 loads of x) and shared by the 4 or 8 columns the thread owns there.

Asym: sum x (q - z) = t + (8 - z) sum x: sum x per word row by fp16x2 adds (fp32 final), and with one
scale row per block (8 - z) s times the thread's row sum once per column per block, not per word.
8-bit: (w & 0x00FF00FF) | magic -> (q0, q2), (w >> 8) -> (q1, q3), minus 1152 -> q - 128;
pairs (x0, x2), (x1, x3). |x| up to ~250 (8-bit) or ~2000 (4-bit) keeps the fp16 partial sums finite
(LLM linear inputs: exllama and Marlin make the same bet).

The M = 1 GEMV is bound by weight loads in flight per warp, not by instruction issue, so the K loop is
software-pipelined in registers (the kernel's docstring). Measured on an H200 (docs/kernels.md): with the
pipeline and a 128x128, 2-warp tile 1.10-1.25x faster than the best earlier kernel on qkv, gate_up and
down (1.4-1.95 TB/s); the fp32 GEMV stays faster on the 4096x4096 layer.

Masks, scales (SCALE_ALIGNED per block, else per word row), act-order (x gathered through perm in
place; the dispatcher does not use it there), bias and the one-launch split-K epilogue follow gemv.py.
Needs PTX inline asm: the dispatcher never picks it under TRITON_INTERPRET; called directly there it
runs pure-Triton stand-ins of the asm (EMULATE), so its indexing, masks and split-K can run on a CPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton.common import cdiv, plan_split_k, store_tile

H2_BITS = (4, 8)


@triton.jit
def _dot_w4(w, pa, pb, pc, pd):
    """fp32 sum_j x_j (q_j - 8) over the 8 codes of each int32 word w; p* are fp16x2 pairs."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, c, d, t, k;
        .reg .b16 lo, hi;
        lop3.b32 a, $1, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 b, $1, 0x00F000F0, 0x64006400, 0xEA;
        shr.u32 t, $1, 8;
        lop3.b32 c, t, 0x000F000F, 0x64006400, 0xEA;
        lop3.b32 d, t, 0x00F000F0, 0x64006400, 0xEA;
        mov.b32 k, 0x64086408;
        sub.rn.f16x2 a, a, k;
        sub.rn.f16x2 c, c, k;
        mov.b32 k, 0x64806480;
        sub.rn.f16x2 b, b, k;
        sub.rn.f16x2 d, d, k;
        mul.rn.f16x2 a, a, $2;
        fma.rn.f16x2 a, b, $3, a;
        fma.rn.f16x2 a, c, $4, a;
        fma.rn.f16x2 a, d, $5, a;
        mov.b32 {lo, hi}, a;
        add.rn.f16 lo, lo, hi;
        cvt.f32.f16 $0, lo;
        }""",
        constraints="=f,r,r,r,r,r",
        args=[w, pa, pb, pc, pd],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _dot_w8(w, pa, pb):
    """fp32 sum_j x_j (q_j - 128) over the 4 codes of each int32 word w; pa = (x0, x2), pb = (x1, x3)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, b, t, k;
        .reg .b16 lo, hi;
        lop3.b32 a, $1, 0x00FF00FF, 0x64006400, 0xEA;
        shr.u32 t, $1, 8;
        lop3.b32 b, t, 0x00FF00FF, 0x64006400, 0xEA;
        mov.b32 k, 0x64806480;
        sub.rn.f16x2 a, a, k;
        sub.rn.f16x2 b, b, k;
        mul.rn.f16x2 a, a, $2;
        fma.rn.f16x2 a, b, $3, a;
        mov.b32 {lo, hi}, a;
        add.rn.f16 lo, lo, hi;
        cvt.f32.f16 $0, lo;
        }""",
        constraints="=f,r,r,r",
        args=[w, pa, pb],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _pack(lo, hi):
    """Two fp16 tensors -> int32 holding the fp16x2 (lo, hi)."""
    lo_bits = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi_bits = hi.to(tl.int16, bitcast=True).to(tl.int32)
    return lo_bits | (hi_bits << 16)


@triton.jit
def _pairs_w4(xi0, xi1, xi2, xi3):
    """xi_m = fp16x2 (x_2m, x_2m+1) -> (x0, x4), (x1, x5)/16, (x2, x6), (x3, x7)/16 (x/16 exact)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 k;
        mov.b32 k, 0x2C002C00;
        prmt.b32 $0, $4, $6, 0x5410;
        prmt.b32 $1, $4, $6, 0x7632;
        prmt.b32 $2, $5, $7, 0x5410;
        prmt.b32 $3, $5, $7, 0x7632;
        mul.rn.f16x2 $1, $1, k;
        mul.rn.f16x2 $3, $3, k;
        }""",
        constraints="=r,=r,=r,=r,r,r,r,r",
        args=[xi0, xi1, xi2, xi3],
        dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _pairs_w8(xi0, xi1):
    """xi_m = fp16x2 (x_2m, x_2m+1) -> (x0, x2), (x1, x3)."""
    return tl.inline_asm_elementwise(
        asm="""{
        prmt.b32 $0, $2, $3, 0x5410;
        prmt.b32 $1, $2, $3, 0x7632;
        }""",
        constraints="=r,=r,r,r",
        args=[xi0, xi1],
        dtype=(tl.int32, tl.int32),
        is_pure=True,
        pack=1,
    )


@triton.jit
def _hsum(a, b, c, d):
    """fp32 sum of the eight fp16 in four fp16x2 registers (fp16x2 adds, 4 terms per lane, then fp32)."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 t, u;
        .reg .b16 lo, hi;
        .reg .f32 flo, fhi;
        add.rn.f16x2 t, $1, $2;
        add.rn.f16x2 u, $3, $4;
        add.rn.f16x2 t, t, u;
        mov.b32 {lo, hi}, t;
        cvt.f32.f16 flo, lo;
        cvt.f32.f16 fhi, hi;
        add.f32 $0, flo, fhi;
        }""",
        constraints="=f,r,r,r,r",
        args=[a, b, c, d],
        dtype=tl.float32,
        is_pure=True,
        pack=1,
    )


# ---- pure-Triton stand-ins for the asm above, same inputs and results (up to fp16 rounding):
# TRITON_INTERPRET=1 runs the kernel's indexing, masks and split-K with these (tests on the CPU).


@triton.jit
def _lo(p):
    return (p & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _hi(p):
    return ((p >> 16) & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _field(w, f: tl.constexpr, BITS: tl.constexpr):
    return ((w >> (f * BITS)) & ((1 << BITS) - 1)).to(tl.float32) - (1 << (BITS - 1))


@triton.jit
def _dot_w4_emu(w, pa, pb, pc, pd):
    t = _field(w, 0, 4) * _lo(pa) + _field(w, 4, 4) * _hi(pa)
    t += 16.0 * (_field(w, 1, 4) * _lo(pb) + _field(w, 5, 4) * _hi(pb))
    t += _field(w, 2, 4) * _lo(pc) + _field(w, 6, 4) * _hi(pc)
    t += 16.0 * (_field(w, 3, 4) * _lo(pd) + _field(w, 7, 4) * _hi(pd))
    return t


@triton.jit
def _dot_w8_emu(w, pa, pb):
    t = _field(w, 0, 8) * _lo(pa) + _field(w, 2, 8) * _hi(pa)
    t += _field(w, 1, 8) * _lo(pb) + _field(w, 3, 8) * _hi(pb)
    return t


@triton.jit
def _pack32(lo, hi):
    return _pack(lo.to(tl.float16), hi.to(tl.float16))


@triton.jit
def _pairs_w4_emu(xi0, xi1, xi2, xi3):
    pa = _pack32(_lo(xi0), _lo(xi2))
    pb = _pack32(_hi(xi0) * 0.0625, _hi(xi2) * 0.0625)
    pc = _pack32(_lo(xi1), _lo(xi3))
    pd = _pack32(_hi(xi1) * 0.0625, _hi(xi3) * 0.0625)
    return pa, pb, pc, pd


@triton.jit
def _pairs_w8_emu(xi0, xi1):
    return _pack32(_lo(xi0), _lo(xi1)), _pack32(_hi(xi0), _hi(xi1))


@triton.jit
def _hsum_emu(a, b, c, d):
    return _lo(a) + _hi(a) + _lo(b) + _hi(b) + _lo(c) + _hi(c) + _lo(d) + _hi(d)


@triton.jit
def _load_w(qw_ptr, kb, pred, row_in_block, n3, num_rows, N, stride_qk, stride_qn,
            PF: tl.constexpr, BLOCK_N: tl.constexpr, TWO: tl.constexpr, EVEN: tl.constexpr):
    """The [WARPS, R, BN] word tile(s) of the block starting at code kb (16-byte loads along N).
    EVEN: no mask (the caller clamps the prefetch to the split's last block); else pred (scalar)
    false -> nothing is loaded (the prefetch past the end of the split)."""
    rows = kb // PF + row_in_block  # [WARPS, R]
    w_ptrs = qw_ptr + rows[:, :, None] * stride_qk + n3 * stride_qn
    if EVEN:  # no mask: a masked load zero-fills its destination registers first (4 MOVs per LDG.128)
        w = tl.load(w_ptrs)
        w2 = w
        if TWO:
            w2 = tl.load(w_ptrs + BLOCK_N * stride_qn)
    else:
        w_mask = (rows[:, :, None] < num_rows) & (n3 < N) & pred
        w = tl.load(w_ptrs, mask=w_mask, other=0)
        w2 = w
        if TWO:
            w2 = tl.load(w_ptrs + BLOCK_N * stride_qn, mask=w_mask & (n3 + BLOCK_N < N), other=0)
    return w, w2


@triton.jit
def _load_sz(s_ptr, z_ptr, kb, pred, offs_r, offs_w, offs_n, N, group_size, num_groups,
             stride_sg, stride_sn, stride_zg, stride_zn,
             PF: tl.constexpr, HAS_ZEROS: tl.constexpr, SCALE_ALIGNED: tl.constexpr, EVEN_K: tl.constexpr,
             EVEN_N: tl.constexpr):
    """Scales (and zeros) of the block at code kb, in their own dtype (kept 16-bit while they wait in
    registers): [WARPS, 1, BN] (one scale row per block) or [WARPS, R, BN] (one per word row);
    z = s without zeros (never used). pred: as in _load_w (ignored when EVEN_K)."""
    R: tl.constexpr = offs_r.shape[0]
    if SCALE_ALIGNED:
        # one scale row per block, loaded as [WARPS, 1, BN] (4 contiguous per thread) so that it gets
        # the words' own layout and broadcasts over R for free (a [BN] load is laid out one per
        # thread and converted through shared memory behind two barriers)
        g = tl.minimum(kb // group_size, num_groups - 1)
        sz_offs = offs_n[None, None, :] + 0 * offs_w[:, None, None]
        sz_offs = tl.max_contiguous(tl.multiple_of(sz_offs, (1, 1, 4)), (1, 1, 4))
        sz_mask = (offs_n[None, None, :] + 0 * offs_w[:, None, None]) < N
        s_ptrs = s_ptr + g * stride_sg + sz_offs * stride_sn
        z_ptrs = z_ptr + g * stride_zg + sz_offs * stride_zn
        if EVEN_K and EVEN_N:
            s = tl.load(s_ptrs)
            z = s
            if HAS_ZEROS:
                z = tl.load(z_ptrs)
        else:
            if not EVEN_K:
                sz_mask = sz_mask & pred
            s = tl.load(s_ptrs, mask=sz_mask, other=0.0)
            z = s
            if HAS_ZEROS:
                z = tl.load(z_ptrs, mask=sz_mask, other=0.0)
    else:
        g = (kb + (offs_w[:, None] * R + offs_r[None, :]) * PF) // group_size  # [WARPS, R]
        s_ptrs = s_ptr + g[:, :, None] * stride_sg + offs_n[None, None, :] * stride_sn
        z_ptrs = z_ptr + g[:, :, None] * stride_zg + offs_n[None, None, :] * stride_zn
        if EVEN_K and EVEN_N:  # every word row of the block is < K: g < num_groups
            s = tl.load(s_ptrs)
            z = s
            if HAS_ZEROS:
                z = tl.load(z_ptrs)
        else:
            sz_mask = (g[:, :, None] < num_groups) & (offs_n[None, None, :] < N)
            if not EVEN_K:
                sz_mask = sz_mask & pred
            s = tl.load(s_ptrs, mask=sz_mask, other=0.0)
            z = s
            if HAS_ZEROS:
                z = tl.load(z_ptrs, mask=sz_mask, other=0.0)
    return s, z


@triton.jit
def _xload(x_ptr, perm_ptr, k, k_hi, stride_xk, stride_pk, HAS_PERM: tl.constexpr):
    """x[perm[k]] (or x[k]), 0 from k_hi on."""
    if HAS_PERM:
        kx = tl.load(perm_ptr + k * stride_pk, mask=k < k_hi, other=0)
    else:
        kx = k
    return tl.load(x_ptr + kx * stride_xk, mask=k < k_hi, other=0.0)


@triton.jit
def _load_x(x_ptr, perm_ptr, kb, k_hi, row_in_block, stride_xk, stride_pk,
            PF: tl.constexpr, BITS: tl.constexpr, HAS_PERM: tl.constexpr, X_PAIRS: tl.constexpr,
            EVEN_K: tl.constexpr):
    """xi_m [WARPS, R] = fp16x2 (x_{k + 2m}, x_{k + 2m + 1}) for each word row's first code k
    (m < 4 at 4-bit, m < 2 at 8-bit; xi2 = xi3 = xi0 there, unused); 0 past K / the split
    (EVEN_K: no mask, the caller clamps the prefetch to the split's last block)."""
    k_row = kb + row_in_block * PF  # [WARPS, R]
    if X_PAIRS:  # x contiguous, K even: int32 loads of two fp16
        xr = x_ptr.to(tl.pointer_type(tl.int32)) + k_row // 2
        if EVEN_K:
            xi0 = tl.load(xr + 0)
            xi1 = tl.load(xr + 1)
            xi2 = xi0
            xi3 = xi0
            if BITS == 4:
                xi2 = tl.load(xr + 2)
                xi3 = tl.load(xr + 3)
        else:  # k_row >= k_hi covers pred
            xi0 = tl.load(xr + 0, mask=k_row + 0 < k_hi, other=0)
            xi1 = tl.load(xr + 1, mask=k_row + 2 < k_hi, other=0)
            xi2 = xi0
            xi3 = xi0
            if BITS == 4:
                xi2 = tl.load(xr + 2, mask=k_row + 4 < k_hi, other=0)
                xi3 = tl.load(xr + 3, mask=k_row + 6 < k_hi, other=0)
    else:
        xi0 = _pack(_xload(x_ptr, perm_ptr, k_row + 0, k_hi, stride_xk, stride_pk, HAS_PERM),
                    _xload(x_ptr, perm_ptr, k_row + 1, k_hi, stride_xk, stride_pk, HAS_PERM))
        xi1 = _pack(_xload(x_ptr, perm_ptr, k_row + 2, k_hi, stride_xk, stride_pk, HAS_PERM),
                    _xload(x_ptr, perm_ptr, k_row + 3, k_hi, stride_xk, stride_pk, HAS_PERM))
        xi2 = xi0
        xi3 = xi0
        if BITS == 4:
            xi2 = _pack(_xload(x_ptr, perm_ptr, k_row + 4, k_hi, stride_xk, stride_pk, HAS_PERM),
                        _xload(x_ptr, perm_ptr, k_row + 5, k_hi, stride_xk, stride_pk, HAS_PERM))
            xi3 = _pack(_xload(x_ptr, perm_ptr, k_row + 6, k_hi, stride_xk, stride_pk, HAS_PERM),
                        _xload(x_ptr, perm_ptr, k_row + 7, k_hi, stride_xk, stride_pk, HAS_PERM))
    return xi0, xi1, xi2, xi3


@triton.jit
def _load_block(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, kb, k_hi, kb_last, offs_r, offs_w, offs_n, offs_n2, n3,
                row_in_block, N, num_rows, group_size, num_groups,
                stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
                PF: tl.constexpr, BITS: tl.constexpr, BLOCK_N: tl.constexpr, TWO: tl.constexpr,
                HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, SCALE_ALIGNED: tl.constexpr,
                X_PAIRS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr):
    """Everything block kb's math reads: (w, w2, s, z, s2, z2, xi0, xi1, xi2, xi3).

    A prefetch may ask for a block past the split: EVEN_K clamps it to the split's last block
    (kb_last; re-read from L1/L2, never used), so no load needs a predicate and the zero-fill of
    its registers that comes with one; otherwise it is masked off (pred, and the K-tail masks)."""
    pred = kb < k_hi
    if EVEN_K:
        kb = tl.minimum(kb, kb_last)
    w, w2 = _load_w(qw_ptr, kb, pred, row_in_block, n3, num_rows, N, stride_qk, stride_qn,
                    PF, BLOCK_N, TWO, EVEN_K and EVEN_N)
    s, z = _load_sz(s_ptr, z_ptr, kb, pred, offs_r, offs_w, offs_n, N, group_size, num_groups,
                    stride_sg, stride_sn, stride_zg, stride_zn, PF, HAS_ZEROS, SCALE_ALIGNED, EVEN_K, EVEN_N)
    s2, z2 = s, z
    if TWO:
        s2, z2 = _load_sz(s_ptr, z_ptr, kb, pred, offs_r, offs_w, offs_n2, N, group_size, num_groups,
                          stride_sg, stride_sn, stride_zg, stride_zn, PF, HAS_ZEROS, SCALE_ALIGNED, EVEN_K, EVEN_N)
    xi0, xi1, xi2, xi3 = _load_x(x_ptr, perm_ptr, kb, k_hi, row_in_block, stride_xk, stride_pk,
                                 PF, BITS, HAS_PERM, X_PAIRS, EVEN_K)
    return w, w2, s, z, s2, z2, xi0, xi1, xi2, xi3


@triton.jit
def _pairs(xi0, xi1, xi2, xi3, BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, EMULATE: tl.constexpr):
    """Activation pairs (pa, pb, pc, pd) for the word decode and, with zeros, the row sums xs."""
    xs = xi0  # unused without zeros
    if BITS == 4:
        if EMULATE:
            pa, pb, pc, pd = _pairs_w4_emu(xi0, xi1, xi2, xi3)
            if HAS_ZEROS:
                xs = _hsum_emu(xi0, xi1, xi2, xi3)
        else:
            pa, pb, pc, pd = _pairs_w4(xi0, xi1, xi2, xi3)
            if HAS_ZEROS:
                xs = _hsum(xi0, xi1, xi2, xi3)
    else:
        if EMULATE:
            pa, pb = _pairs_w8_emu(xi0, xi1)
            if HAS_ZEROS:
                xs = _hsum_emu(xi0, xi1, xi0 & 0, xi1 & 0)
        else:
            pa, pb = _pairs_w8(xi0, xi1)
            if HAS_ZEROS:
                xs = _hsum(xi0, xi1, xi0 & 0, xi1 & 0)
        pc = pa  # unused
        pd = pb
    return pa, pb, pc, pd, xs


@triton.jit
def _tile(acc, accz, w, s, z, pa, pb, pc, pd, xs,
          BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, SCALE_ALIGNED: tl.constexpr, EMULATE: tl.constexpr):
    """acc [WARPS, R, BN] += s sum_j x_j (q_j - z) for one tile of words (s, z already loaded)."""
    BIAS_Q: tl.constexpr = 1 << (BITS - 1)  # the asm subtracts it from every code
    if EMULATE:
        if BITS == 4:
            t = _dot_w4_emu(w, pa[:, :, None], pb[:, :, None], pc[:, :, None], pd[:, :, None])
        else:
            t = _dot_w8_emu(w, pa[:, :, None], pb[:, :, None])
    elif BITS == 4:
        t = _dot_w4(w, pa[:, :, None], pb[:, :, None], pc[:, :, None], pd[:, :, None])
    else:
        t = _dot_w8(w, pa[:, :, None], pb[:, :, None])
    s = s.to(tl.float32)
    acc += s * t
    if HAS_ZEROS:
        z = z.to(tl.float32)
        if SCALE_ALIGNED:  # (8 - z) s sum x: one FFMA per column per block on the thread's row sum
            accz += ((BIAS_Q - z) * s) * tl.sum(xs, axis=1)[:, None, None]
        else:
            acc += ((BIAS_Q - z) * s) * xs[:, :, None]
    return acc, accz


@triton.jit
def _gemv_h2_kernel(  # M == 1, fp16 x
    x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, bias_ptr, y_ptr, ws_ptr, lock_ptr,
    N, K, group_size, k_per_split, split_k,
    stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk, stride_yn,
    BITS: tl.constexpr, HAS_ZEROS: tl.constexpr, HAS_PERM: tl.constexpr, HAS_BIAS: tl.constexpr,
    SCALE_ALIGNED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_KW: tl.constexpr, USE_SPLIT: tl.constexpr,
    X_PAIRS: tl.constexpr, EVEN_K: tl.constexpr, EVEN_N: tl.constexpr, TWO: tl.constexpr, WARPS: tl.constexpr,
    DEPTH: tl.constexpr, EMULATE: tl.constexpr,
):
    """Program (pid_n, pid_k): columns [pid_n * BN, +BN) (and [+BN, +2 BN) when TWO: the two tiles
    share each thread's activation pairs, so a thread owns 8 columns per word row, not 4), K range
    [k_lo, k_hi) of its split. Word tiles are [WARPS, R, BN] (word row i * R + r, BN = 128 =
    32 threads x 4 columns): warp i owns R word rows, each thread 4 columns of them (16-byte
    loads), so per-row values are [WARPS, R] and per-column ones [WARPS, 1, BN], both in the
    words' layout.

    The K loop is software-pipelined in registers, DEPTH (1 or 2) blocks ahead: the words,
    scales/zeros and activations of block i + DEPTH are loaded before block i's math. Without it
    ptxas put each 16-byte word load next to its consumers and reused the destination registers,
    so a warp had 1-4 loads in flight, not a whole block's; an M = 1 GEMV is bound by bytes in
    flight (Little's law), not by issue. Prefetches past the split's end move no DRAM bytes."""
    PF: tl.constexpr = 32 // BITS
    BLOCK_K: tl.constexpr = BLOCK_KW * PF
    R: tl.constexpr = BLOCK_KW // WARPS
    CTA_N: tl.constexpr = BLOCK_N * 2 if TWO else BLOCK_N
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    offs_n = pid_n * CTA_N + tl.arange(0, BLOCK_N)
    offs_n2 = offs_n + BLOCK_N
    offs_r = tl.arange(0, R)
    offs_w = tl.arange(0, WARPS)
    row_in_block = offs_w[:, None] * R + offs_r[None, :]  # [WARPS, R]
    num_rows = (K + PF - 1) // PF
    num_groups = (K + group_size - 1) // group_size
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(K, k_lo + k_per_split)
    acc = tl.zeros((WARPS, R, BLOCK_N), dtype=tl.float32)
    acc2 = tl.zeros((WARPS, R, BLOCK_N), dtype=tl.float32)
    accz = tl.zeros((WARPS, 1, BLOCK_N), dtype=tl.float32)  # aligned asym: (8 - z) s sum x
    accz2 = tl.zeros((WARPS, 1, BLOCK_N), dtype=tl.float32)
    n3 = offs_n[None, None, :]

    # Register pipeline, DEPTH blocks ahead: block i + DEPTH's loads are issued before block i's
    # math, which reads registers loaded DEPTH iterations earlier. ptxas sinks independent loads
    # to the end of the iteration (fewest live registers), so with DEPTH = 1 a warp still waits for
    # the loads it just issued (all of a block's loads are in flight together, though); with
    # DEPTH = 2 the loads sunk to the end of iteration i are first used in iteration i + 2, so they
    # fly during block i + 1's math.
    kb_last = k_hi - BLOCK_K
    cur = _load_block(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, k_lo, k_hi, kb_last, offs_r, offs_w, offs_n, offs_n2,
                      n3, row_in_block, N, num_rows, group_size, num_groups, stride_xk, stride_qk, stride_qn,
                      stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
                      PF, BITS, BLOCK_N, TWO, HAS_ZEROS, HAS_PERM, SCALE_ALIGNED, X_PAIRS, EVEN_K, EVEN_N)
    if DEPTH == 2:
        nxt = _load_block(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, k_lo + BLOCK_K, k_hi, kb_last, offs_r, offs_w,
                          offs_n, offs_n2, n3, row_in_block, N, num_rows, group_size, num_groups,
                          stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
                          PF, BITS, BLOCK_N, TWO, HAS_ZEROS, HAS_PERM, SCALE_ALIGNED, X_PAIRS, EVEN_K, EVEN_N)
    for kb in range(k_lo, k_hi, BLOCK_K):
        new = _load_block(x_ptr, qw_ptr, s_ptr, z_ptr, perm_ptr, kb + DEPTH * BLOCK_K, k_hi, kb_last, offs_r,
                          offs_w, offs_n, offs_n2, n3, row_in_block, N, num_rows, group_size, num_groups,
                          stride_xk, stride_qk, stride_qn, stride_sg, stride_sn, stride_zg, stride_zn, stride_pk,
                          PF, BITS, BLOCK_N, TWO, HAS_ZEROS, HAS_PERM, SCALE_ALIGNED, X_PAIRS, EVEN_K, EVEN_N)
        w, w2, s, z, s2, z2, xi0, xi1, xi2, xi3 = cur
        pa, pb, pc, pd, xs = _pairs(xi0, xi1, xi2, xi3, BITS, HAS_ZEROS, EMULATE)
        acc, accz = _tile(acc, accz, w, s, z, pa, pb, pc, pd, xs, BITS, HAS_ZEROS, SCALE_ALIGNED, EMULATE)
        if TWO:
            acc2, accz2 = _tile(acc2, accz2, w2, s2, z2, pa, pb, pc, pd, xs,
                                BITS, HAS_ZEROS, SCALE_ALIGNED, EMULATE)
        if DEPTH == 2:  # rotate the buffers
            cur = nxt
            nxt = new
        else:
            cur = new
    offs_m = tl.arange(0, 1)
    y = (tl.sum(tl.sum(acc, axis=0), axis=0) + tl.sum(tl.sum(accz, axis=0), axis=0))[None, :]  # [1, BN]
    if TWO:  # one split-K counter per column tile: 2 pid_n, 2 pid_n + 1
        store_tile(y, offs_m, offs_n, 1, N, y_ptr, 0, stride_yn, bias_ptr, ws_ptr, lock_ptr,
                   pid_k, 2 * pid_n, split_k, HAS_BIAS, USE_SPLIT)
        y2 = (tl.sum(tl.sum(acc2, axis=0), axis=0) + tl.sum(tl.sum(accz2, axis=0), axis=0))[None, :]
        store_tile(y2, offs_m, offs_n2, 1, N, y_ptr, 0, stride_yn, bias_ptr, ws_ptr, lock_ptr,
                   pid_k, 2 * pid_n + 1, split_k, HAS_BIAS, USE_SPLIT)
    else:
        store_tile(y, offs_m, offs_n, 1, N, y_ptr, 0, stride_yn, bias_ptr, ws_ptr, lock_ptr,
                   pid_k, pid_n, split_k, HAS_BIAS, USE_SPLIT)


def h2_depth(num_stages: int) -> int:
    """Blocks the K loop loads ahead (the choice's num_stages - 1, 1 or 2): register pipeline depth."""
    return 2 if num_stages >= 3 else 1


def gemv_h2_supported(qw: QuantizedWeight, block_n: int, block_k: int, num_warps: int,
                      dtype: torch.dtype, M: int) -> bool:
    """fp16 x, one row, 4- or 8-bit, whole words per group (or aligned blocks), a tile the kernel
    lays out (BLOCK_N = 128 or 256 = two 128-column tiles, word rows a multiple of the warps), and
    real PTX: never under TRITON_INTERPRET (its interpreter cannot run inline asm)."""
    if os.environ.get("TRITON_INTERPRET") == "1" or dtype != torch.float16 or M != 1 or qw.bits not in H2_BITS:
        return False
    pf = 32 // qw.bits
    g, K = qw.group_size, qw.in_features
    if block_n not in (128, 256) or block_k % pf or (block_k // pf) % num_warps:
        return False
    return g >= K or g % block_k == 0 or g % pf == 0


def quant_gemv_h2(
    x: Tensor, qw: QuantizedWeight, bias: Tensor | None, *,
    block_n: int, block_k: int, split_k: int, num_warps: int, num_stages: int,
    out: Tensor | None = None, **_: int,
) -> Tensor:
    """y [1, N] = x[:, perm] @ W + bias for fp16 x [1, K] on a CUDA device (see the module docstring).

    block_n: 128 (one tile of 128 columns) or 256 (two tiles sharing the activation pairs);
    block_k counts codes (BLOCK_KW = block_k // PF word rows, a multiple of num_warps);
    num_stages 2 or 3: the K loop loads 1 or 2 blocks ahead (h2_depth).
    """
    M, K = x.shape
    N = qw.out_features
    pf = 32 // qw.bits
    assert M == 1 and K == qw.in_features and x.dtype == torch.float16 and qw.bits in H2_BITS
    assert block_n in (128, 256) and block_k % pf == 0 and (block_k // pf) % num_warps == 0
    assert qw.group_size >= K or qw.group_size % block_k == 0 or qw.group_size % pf == 0
    y = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    num_pid_n = cdiv(N, block_n)
    k_per_split, split_k, ws, locks = plan_split_k(K, split_k, block_k, 2 * num_pid_n, y)
    aligned = qw.group_size >= K or qw.group_size % block_k == 0
    zeros = qw.zeros if qw.zeros is not None else qw.scales
    perm = qw.perm if qw.perm is not None else qw.qweight
    # x read as int32 pairs (4 loads per word row instead of 8): contiguous, 4-byte aligned, K even
    x_pairs = qw.perm is None and K % 2 == 0 and x.stride(1) == 1 and x.data_ptr() % 4 == 0
    _gemv_h2_kernel[(num_pid_n, split_k)](
        x, qw.qweight, qw.scales, zeros, perm, bias if bias is not None else y, y, ws, locks,
        N, K, qw.group_size, k_per_split, split_k,
        x.stride(1), qw.qweight.stride(0), qw.qweight.stride(1),
        qw.scales.stride(0), qw.scales.stride(1), zeros.stride(0), zeros.stride(1), perm.stride(0), y.stride(1),
        BITS=qw.bits, HAS_ZEROS=qw.zeros is not None, HAS_PERM=qw.perm is not None, HAS_BIAS=bias is not None,
        SCALE_ALIGNED=aligned, BLOCK_N=128, BLOCK_KW=block_k // pf, USE_SPLIT=split_k > 1,
        X_PAIRS=x_pairs, EVEN_K=K % block_k == 0, EVEN_N=N % block_n == 0, TWO=block_n == 256, WARPS=num_warps,
        DEPTH=h2_depth(num_stages), EMULATE=os.environ.get("TRITON_INTERPRET") == "1",
        num_warps=num_warps, num_stages=min(num_stages, 2),  # the pipeline is ours (DEPTH), not Triton's
    )
    return y
