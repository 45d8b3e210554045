"""Triton kernels behind `edgellm.kernels.quant_matmul` on CUDA (imported only on the GPU path).

    gemv.py      split-K GEMV for decode (M = 1, and a 3-D variant for a few rows)
    gemm.py      fused dequant + tl.dot GEMM (split-K for small M)
    dequant.py   dequantize-to-scratch + cuBLAS (kept only where it measured faster)
    common.py    field decode trick, one-launch split-K fixup, split-K counters
    table.py     the dispatch table: (bits, group, N, K, M-bucket) -> kernel + blocks, JSON per GPU
    dispatch.py  quant_matmul_triton: look up, run
    tune.py      warm-up tuning (CUDA-graph timing over rotated weight copies), user cache

docs/kernels.md describes the algorithms, the table and the measured results.
"""
