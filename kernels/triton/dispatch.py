"""GPU quant_matmul: pick a kernel from the dispatch table by (bits, group, N, K, M-bucket), run it.

    M (tokens)   usual winner on an H200 (the table, not this list, decides)
    1            gemv_h2.quant_gemv_h2  fp16 x: split-K GEMV with packed fp16x2 math (inline PTX)
    1 .. 4       gemv.quant_gemv        split-K GEMV, no tensor cores (bf16 x at M = 1 too)
    8 .. 64      gemm.quant_gemm        fused dequant + tl.dot, split-K to fill the SMs
    128 ..       gemm.quant_gemm / dequant.quant_dequant_mm (only where it measured faster)

fp32 activations always take dequant_mm (cuBLAS fp32); group sizes the fused kernels cannot
tile (group_size % (32 // bits) != 0) too. A gemv_h2 choice a call cannot use (bf16 x, M > 1, or
under TRITON_INTERPRET, which cannot run inline PTX) becomes the fp32 GEMV 1x64x(16 words) w2 with
the same split (the family that won M = 1 before); so does a gemv_h2 choice for an act-order weight
(measured slower there, see choice_supported). Any other unusable choice becomes `default_choice`.

Act-order: for M < PERM_GATHER_MIN_M the kernels read x through perm in place (no extra launch).
From PERM_GATHER_MIN_M rows on, x[:, perm] is gathered once per call (index_select) and the
kernels run without perm: every CTA of the fused kernels re-reads its x tile, and a scattered
2-byte gather costs up to 32 L1 transactions per warp instruction, so the in-kernel gather made
the W4 act-order stack 2.6x slower at M=16 on an H200 (docs/kernels.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton.dequant import quant_dequant_mm
from edgellm.kernels.triton.gemm import gemm_supported, quant_gemm
from edgellm.kernels.triton.gemv import gemv_supported, quant_gemv
from edgellm.kernels.triton.gemv_h2 import gemv_h2_supported, quant_gemv_h2
from edgellm.kernels.triton.table import DispatchTable, KernelChoice, default_choice, load_table, table_group


@functools.lru_cache(maxsize=None)
def device_table(device: torch.device) -> DispatchTable:
    """The table for one GPU, read once per process (tune.warmup clears this after writing)."""
    return load_table(device)


@functools.lru_cache(maxsize=None)
def device_num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def choose_kernel(qw: QuantizedWeight, M: int, table: DispatchTable, num_sms: int, dtype: torch.dtype) -> KernelChoice:
    K, N = qw.in_features, qw.out_features
    if dtype == torch.float32:
        return KernelChoice("dequant_mm")
    group = table_group(qw.group_size, K)
    choice = table.lookup(qw.bits, group, N, K, M, num_sms)
    if choice.kernel == "gemv_h2" and not choice_supported(choice, qw, M, dtype):
        # bf16 x, act-order, the interpreter: the fp32 GEMV family that won M = 1 before gemv_h2, same split
        choice = KernelChoice("gemv", 1, 64, 16 * (32 // qw.bits), choice.split_k, 2, 3)
    if not choice_supported(choice, qw, M, dtype):
        choice = default_choice(qw.bits, group, N, K, M, num_sms)
    return choice


def choice_supported(choice: KernelChoice, qw: QuantizedWeight, M: int, dtype: torch.dtype = torch.float16) -> bool:
    if choice.kernel == "gemv_h2":
        # act-order: the kernel gathers x through perm correctly (tested) but 8 dependent perm -> x
        # loads per word row cost more than they save: the W4 g128 act-order stack at M = 1 took 3.73 ms
        # in the H200 run that put gate_up on gemv_h2, 3.35-3.40 ms in earlier runs on the fp32 GEMV
        return qw.perm is None and gemv_h2_supported(qw, choice.block_n, choice.block_k, choice.num_warps, dtype, M)
    if choice.kernel == "gemv":
        return choice.block_k % (32 // qw.bits) == 0 and gemv_supported(qw, choice.block_k)
    if choice.kernel == "gemm":
        return gemm_supported(qw, choice.block_k)
    return True


PERM_GATHER_MIN_M = 2


def run_choice(
    choice: KernelChoice, x: Tensor, qw: QuantizedWeight, bias: Tensor | None, out: Tensor | None = None
) -> Tensor:
    """x [M, K] -> y [M, N] (written into `out` if given) with the given kernel and blocks."""
    if choice.kernel == "dequant_mm":
        return quant_dequant_mm(x, qw, bias, out=out)
    if qw.perm is not None and x.shape[0] >= PERM_GATHER_MIN_M:
        x = x.index_select(1, qw.perm)
        qw = QuantizedWeight(qw.qweight, qw.scales, qw.zeros, qw.bits, qw.group_size, None, qw.in_features)
    kwargs = dict(
        block_m=choice.block_m, block_n=choice.block_n, block_k=choice.block_k, split_k=choice.split_k,
        num_warps=choice.num_warps, num_stages=choice.num_stages,
    )
    if choice.kernel == "gemv_h2":
        return quant_gemv_h2(x, qw, bias, out=out, **kwargs)
    if choice.kernel == "gemv":
        if choice.block_m < x.shape[0]:
            kwargs["block_m"] = 1 << (x.shape[0] - 1).bit_length()
        return quant_gemv(x, qw, bias, out=out, **kwargs)
    return quant_gemm(x, qw, bias, out=out, **kwargs)


def quant_matmul_triton(
    x: Tensor, qw: QuantizedWeight, bias: Tensor | None = None,
    table: DispatchTable | None = None, num_sms: int | None = None, out: Tensor | None = None,
) -> Tensor:
    """y [..., N] = x[..., perm] @ W + bias on the GPU (or under TRITON_INTERPRET=1 with a table).

    out: optional contiguous [prod(...), N] result buffer in x's dtype.
    """
    K = qw.in_features
    if x.shape[-1] != K:
        raise ValueError(f"quant_matmul: x last dim expected {K} (in_features), got {list(x.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if M == 0:
        return x.new_empty(*lead, qw.out_features)
    if table is None:
        table = device_table(x.device)
    if num_sms is None:
        num_sms = device_num_sms(x.device)
    choice = choose_kernel(qw, M, table, num_sms, x.dtype)
    return run_choice(choice, x2, qw, bias, out).reshape(*lead, qw.out_features)
