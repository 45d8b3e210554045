"""Pieces shared by the Triton quant-matmul kernels: the bit trick that turns a packed field
into a float, the split-K epilogue, and the split-K tile counters.

Field decode (no int->float conversion instruction, which runs at 1/8 of the FMA rate):
a b-bit code q sitting at bits [bf, bf + b) of a word, with bf + b <= 23, is OR-ed into the
mantissa of 1.0f:

    bits(1.0f) | (word & (MASK << bf))  ==  1 + q * 2^(bf - 23)      (exact)
    u = that - 1.0                       ==  q * 2^(bf - 23)           (exact, Sterbenz)

so one LOP3 and one FADD give q up to a power of two, which is folded into the activation
(3-D GEMV) or into the scale (GEMM). Fields at bf >= 16 are read from `word >> 16` instead, so
every field of a 2-, 4- or 8-bit word fits inside the 23-bit mantissa.

The M = 1 GEMV moves each field to the top of the mantissa instead (one SHF, one LOP3):
v = 1 + q / 2^b in [1, 2), t = sum x * v, and sum x * q = 2^b * (t - sum x), with no
per-field scaling of x and no FADD per code.

Split-K (USE_SPLIT, split_k > 1) in ONE launch: each program writes its fp32 partial tile to a
scratch `ws [split_k, M, N]`, then bumps a per-tile counter; the program that arrives last
sums the split_k partials, adds the bias, writes y and resets the counter to 0. No memset,
no second reduction kernel, CUDA-graph safe. The counters live in one int32 buffer per device
(`split_k_locks`), zero at rest; kernels on one stream never see each other's counts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

# bits of 1.0f, passed as a kernel argument: as a register operand it lets ptxas fuse
# `(w & mask) | magic` into one LOP3 (with two immediates it emits two)
MAGIC_ONE = 0x3F800000
NUM_LOCKS = 1 << 18  # tiles of one launch; more tiles -> the launcher uses SPLIT_K = 1
_LOCKS: dict[torch.device, Tensor] = {}  # one per device, allocated once (before graph capture)


def split_k_locks(device: torch.device) -> Tensor:
    """The device's split-K tile counters: int32 [NUM_LOCKS], all zero between launches."""
    locks = _LOCKS.get(device)
    if locks is None:
        locks = torch.zeros(NUM_LOCKS, dtype=torch.int32, device=device)
        _LOCKS[device] = locks
    return locks


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def plan_split_k(
    K: int, split_k: int, block_k: int, num_tiles: int, y: Tensor
) -> tuple[int, int, Tensor, Tensor]:
    """(k_per_split, split_k, ws, locks) for a launch of num_tiles output tiles writing y [M, N].

    Each split covers a whole number of K blocks; splits that would be empty are dropped; a launch
    with more tiles than counters runs unsplit. Without split-K, ws and locks are y (never touched).
    """
    k_per_split = cdiv(cdiv(K, split_k), block_k) * block_k
    split_k = min(split_k, cdiv(K, k_per_split))
    if num_tiles > NUM_LOCKS:
        split_k = 1
    if split_k == 1:
        return k_per_split, 1, y, y
    ws = torch.empty(split_k, *y.shape, dtype=torch.float32, device=y.device)
    return k_per_split, split_k, ws, split_k_locks(y.device)


@triton.jit
def store_tile(
    acc, offs_m, offs_n, M, N,
    y_ptr, stride_ym, stride_yn, bias_ptr, ws_ptr, lock_ptr, pid_k, tile_id, split_k,
    HAS_BIAS: tl.constexpr, USE_SPLIT: tl.constexpr,
):
    """acc [BM, BN] fp32 -> y (x's dtype), directly or through the split-K fixup."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn
    if not USE_SPLIT:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        ws_tile = offs_m[:, None] * N + offs_n[None, :]
        tl.store(ws_ptr + pid_k * M * N + ws_tile, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is written before the release below
        count = tl.atomic_add(lock_ptr + tile_id, 1, sem="acq_rel")
        if count == split_k - 1:
            total = tl.zeros_like(acc)
            for s in range(split_k):
                total += tl.load(ws_ptr + s * M * N + ws_tile, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)[None, :]
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(lock_ptr + tile_id, 0)
