"""Warm-up tuning: time candidate kernels per (bits, group, N, K, M-bucket), keep the winner.

Runs at warm-up (before CUDA-graph capture), never on the request path. Each candidate is
timed with CUDA-graph replays over enough rotated weight copies that the working set is
3x the L2 (a 4096x4096 4-bit layer is 8.4 MB; timing one copy would time the L2). Results
are written to $EDGELLM_HOME/kernels/<GPU>.json and merged over the shipped table.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.triton import dispatch
from edgellm.kernels.triton.table import (
    M_BUCKETS,
    DispatchTable,
    KernelChoice,
    default_choice,
    gpu_file_name,
    read_table,
    shape_key,
    table_group,
    user_dir,
    write_table,
)

logger = logging.getLogger(__name__)


def time_cuda_graph(fns: list[Callable[[], object]], reps: int = 20) -> float:
    """Median µs per call of fns (one call each, in order) replayed from one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in fns:  # compile and allocate outside the capture
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / len(fns))
    del graph
    times.sort()
    return times[len(times) // 2]


def rotated_copies(qw: QuantizedWeight, l2_bytes: int, factor: float = 3.0, max_copies: int = 64) -> list[QuantizedWeight]:
    """qw plus clones so that all of them together exceed factor * L2."""
    n = max(2, min(max_copies, int(factor * l2_bytes / max(1, qw.nbytes())) + 1))
    clones = [qw]
    for _ in range(n - 1):
        clones.append(QuantizedWeight(
            qweight=qw.qweight.clone(), scales=qw.scales.clone(),
            zeros=None if qw.zeros is None else qw.zeros.clone(), bits=qw.bits, group_size=qw.group_size,
            perm=None if qw.perm is None else qw.perm.clone(), in_features=qw.in_features,
        ))
    return clones


def l2_cache_bytes(device: torch.device) -> int:
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20))


def candidates(bits: int, group: int, N: int, K: int, M: int, num_sms: int) -> list[KernelChoice]:
    """What warm-up times for one M-bucket: a few GEMV, GEMM and dequant+cuBLAS shapes.

    Kept small on purpose: every distinct constexpr set is one Triton compile (~1 s).
    """
    pf = 32 // bits
    out: list[KernelChoice] = [default_choice(bits, group, N, K, M, num_sms)]

    def tileable(bk: int) -> bool:
        return group == -1 or group % bk == 0 or group % pf == 0

    splits = (1, 2, 4, 8)
    if M <= 8:
        bm = 1 << (M - 1).bit_length()
        if bm == 1:
            shapes = [(bn, kw, w, st) for bn, kw in ((64, 8), (64, 16), (128, 4), (128, 8), (128, 16), (256, 8))
                      for w, st in ((4, 2), (4, 3))] + [(128, 16, 8, 3), (256, 16, 8, 3), (64, 16, 2, 3)]
        elif bm <= 4:
            shapes = [(64, 16, 4, 3), (128, 16, 4, 3)]
        else:
            shapes = [(64, 8, 4, 3)]
        for bn, kw, warps, stages in shapes:
            bk = kw * pf
            if not tileable(bk):
                continue
            for split in (1, 2, 4, 8, 16):
                if split == 1 or K // split >= 2 * bk:
                    out.append(KernelChoice("gemv", bm, bn, bk, split, warps, stages))
        if bm == 1 and bits in (4, 8):
            out.extend(h2_candidates(bits, group, K))
    bk_main = 32 * pf if bits != 2 else 16 * pf  # 128 codes at 4-bit, 64 at 2-bit... clipped below
    bk_main = min(bk_main, 256) if bits == 2 else bk_main
    if M >= 2:
        bm = min(128, max(16, 1 << (M - 1).bit_length()))
        if M <= 64:
            for bn in (32, 64, 128):
                bk = bk_main if tileable(bk_main) else default_choice(bits, group, N, K, M, num_sms).block_k
                for split in splits:
                    if split > 1 and (K // split < 2 * bk or -(-M // bm) * -(-N // bn) * split > 8 * num_sms):
                        continue
                    out.append(KernelChoice("gemm", bm, bn, bk, split, 4 if bm * bn <= 64 * 64 else 8, 3))
        else:
            for bm_, bn, warps in ((64, 128, 4), (128, 128, 8), (128, 256, 8), (256, 128, 8)):
                for bk in (64, 128):
                    if bk % pf or not tileable(bk):
                        continue
                    out.append(KernelChoice("gemm", bm_, bn, bk, 1, warps, 3))
        if M >= 128:
            out.append(KernelChoice("dequant_mm"))
    seen, unique = set(), []
    for c in out:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


# gemv_h2 tiles (block_n, word rows, warps): block_n 256 = two 128-column tiles sharing the activation
# pairs; word rows / warps = rows per thread. Words per thread and block: 4 * rows per thread (x2 at
# block_n 256), 16 or 32 (256 or 512 bytes in one block's loads)
H2_SHAPES = ((256, 16, 4), (256, 8, 2), (256, 16, 8), (256, 8, 4), (256, 32, 8), (128, 16, 4), (128, 16, 2))
# register pipeline depth (gemv_h2.h2_depth: num_stages 2 -> 1 block ahead, 3 -> 2 blocks ahead). Offline
# sm_90 cubins, 4-bit: 80-168 registers at depth 1, 128-136 at depth 2 for 16-word tiles, 240-255 for
# 32-word ones, and (256, 32, 8) spills at depth 2 (skipped there). H200, 2026-11-30: (128, 16, 2) at depth 1
# won qkv, gate_up and down; depth 2 lost on every shape (docs/kernels.md)
H2_STAGES = (2, 3)
H2_NO_DEPTH2 = ((256, 32, 8),)


def h2_candidates(bits: int, group: int, K: int, splits: tuple[int, ...] = (1, 2, 4, 8, 16)) -> list[KernelChoice]:
    """gemv_h2 (fp16 x, M = 1) shapes x split-K x pipeline depth; dispatch.choice_supported drops them for
    bf16 x and act-order."""
    pf = 32 // bits
    out = []
    for bn, kw, warps in H2_SHAPES:
        bk = kw * pf
        if group != -1 and group % bk != 0 and group % pf != 0:
            continue
        for stages in H2_STAGES:
            if stages == 3 and (bn, kw, warps) in H2_NO_DEPTH2:
                continue
            for split in splits:
                if split == 1 or K // split >= 2 * bk:
                    out.append(KernelChoice("gemv_h2", 1, bn, bk, split, warps, stages))
    return out


@dataclass(frozen=True, slots=True)
class TuneResult:
    key: str
    bucket: int
    choice: KernelChoice
    us: float
    num_candidates: int


def tune_weight(
    qw: QuantizedWeight, m_buckets: Iterable[int] = M_BUCKETS, dtype: torch.dtype = torch.float16,
    log: Callable[[str], None] | None = None,
) -> list[TuneResult]:
    """Time every candidate of every bucket on qw's shape (random activations), return the winners."""
    device = qw.device
    num_sms = dispatch.device_num_sms(device)
    K, N = qw.in_features, qw.out_features
    group = table_group(qw.group_size, K)
    copies = rotated_copies(qw, l2_cache_bytes(device))
    results = []
    for M in m_buckets:
        x = torch.randn(M, K, dtype=dtype, device=device)
        best: tuple[float, KernelChoice] | None = None
        cands = [c for c in candidates(qw.bits, group, N, K, M, num_sms)
                 if dispatch.choice_supported(c, qw, M, dtype)]
        for choice in cands:
            fns = [lambda c=choice, w=w: dispatch.run_choice(c, x, w, None) for w in copies]
            try:
                us = time_cuda_graph(fns, reps=10)
            except Exception as e:  # a config that fails to compile (out of shared memory) loses
                logger.debug("tune %s M=%d %s failed: %s", shape_key(qw.bits, group, N, K), M, choice, e)
                continue
            if best is None or us < best[0]:
                best = (us, choice)
        assert best is not None, f"no candidate ran for {shape_key(qw.bits, group, N, K)} M={M}"
        res = TuneResult(shape_key(qw.bits, group, N, K), M, best[1], best[0], len(cands))
        if log is not None:
            log(f"  {res.key} M={M:5d}: {best[1]} {best[0]:.1f} us ({len(cands)} candidates)")
        results.append(res)
    return results


@dataclass(frozen=True, slots=True)
class WarmupReport:
    num_shapes_tuned: int
    num_shapes_cached: int
    tune_s: float
    compile_s: float


def warmup(
    weights: Iterable[QuantizedWeight], m_buckets: Iterable[int] = M_BUCKETS, dtype: torch.dtype = torch.float16,
    tune: bool = True, log: Callable[[str], None] | None = None,
) -> WarmupReport:
    """Before graph capture: tune shapes missing from the table (saved to the user cache), then
    run every (shape, bucket) once so all chosen kernels are compiled."""
    weights = list(weights)
    if not weights:
        return WarmupReport(0, 0, 0.0, 0.0)
    device = weights[0].device
    m_buckets = tuple(m_buckets)
    table = dispatch.device_table(device)
    distinct: dict[tuple, QuantizedWeight] = {}
    for qw in weights:
        sig = (qw.bits, table_group(qw.group_size, qw.in_features), qw.out_features, qw.in_features,
               qw.zeros is not None, qw.perm is not None)
        distinct.setdefault(sig, qw)
    t0 = time.perf_counter()
    tuned = DispatchTable(gpu=table.gpu, meta={"torch": torch.__version__, "created": time.strftime("%Y-%m-%d")})
    cached = 0
    for (bits, group, N, K, _, _), qw in distinct.items():
        key = shape_key(bits, group, N, K)
        have = table.entries.get(key, {})
        missing = [b for b in m_buckets if b not in have]
        if key in tuned.entries:
            continue
        if not tune or not missing:
            cached += 1
            continue
        for r in tune_weight(qw, missing, dtype, log):
            tuned.entries.setdefault(r.key, {})[r.bucket] = r.choice
    tune_s = time.perf_counter() - t0
    if tuned.entries:
        path = user_dir() / f"{gpu_file_name(device)}.json"
        previous = read_table(path) if path.is_file() else DispatchTable(gpu=table.gpu)
        write_table(previous.merged(tuned), path)
        dispatch.device_table.cache_clear()
    t1 = time.perf_counter()
    for qw in distinct.values():
        for M in m_buckets:
            x = torch.randn(M, qw.in_features, dtype=dtype, device=device)
            dispatch.quant_matmul_triton(x, qw)
    torch.cuda.synchronize()
    return WarmupReport(len(tuned.entries), cached, tune_s, time.perf_counter() - t1)


__all__ = ["time_cuda_graph", "rotated_copies", "candidates", "h2_candidates", "tune_weight", "warmup", "WarmupReport",
           "TuneResult"]
