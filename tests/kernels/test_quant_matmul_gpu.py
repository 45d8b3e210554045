"""quant_matmul on a CUDA GPU at real Llama shapes, against the fp32 reference (marker gpu).

Each bit width (2, 3-in-4, 4, 8), each group size at 4-bit (-1, 32, 64, 128), sym/asym,
act-order on/off, K x N in {4096x4096, 4096x11008, 11008x4096}, M in {1, 16, 64, 256, 1024},
through the dispatch table (whatever it picks for each M). Outputs poisoned with NaN.
Then gemv_h2 (fp16x2 inline-PTX GEMV, M = 1) called directly over its own grid of cases.
"""

from __future__ import annotations

import pytest
import torch

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import dequantize, pack_codes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
MS = [1, 16, 64, 256, 1024]
# (bits, group, asym, act_order); bits 3 = 3-bit codes in 4-bit containers
FORMATS = [
    (4, 128, False, False), (4, 128, True, False), (4, 128, False, True), (4, 128, True, True),
    (4, -1, True, False), (4, 32, True, True), (4, 64, False, False),
    (8, 128, False, False), (8, 128, True, True),
    (3, 128, True, False), (3, 128, False, True),
    (2, 64, False, False), (2, 64, True, True),
]


def make_weight(K: int, N: int, bits: int, group: int, asym: bool, act: bool, seed: int,
                scale_dtype: torch.dtype = torch.float16) -> QuantizedWeight:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    container = 4 if bits == 3 else bits
    g = K if group == -1 else group
    G = -(-K // g)
    codes = torch.randint(0, 2**bits, (K, N), generator=gen, device="cuda")
    scales = (torch.rand(G, N, generator=gen, device="cuda") * 0.01 + 0.002).to(scale_dtype)
    if asym:
        zeros = torch.randint(0, 2**bits, (G, N), generator=gen, device="cuda").to(scale_dtype)
    elif bits == 3:
        zeros = torch.full((G, N), 4.0, device="cuda", dtype=scale_dtype)
    else:
        zeros = None
    perm = torch.randperm(K, generator=gen, device="cuda").to(torch.int32) if act else None
    return QuantizedWeight(pack_codes(codes, container), scales, zeros, container, g, perm, K)


def check(qw: QuantizedWeight, w_ref: torch.Tensor, M: int, seed: int, dtype=torch.float16, tol=2e-3) -> None:
    from edgellm.kernels.triton.dispatch import quant_matmul_triton

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, qw.in_features, generator=gen, device="cuda").to(dtype)
    bias = torch.randn(qw.out_features, generator=gen, device="cuda").to(dtype)
    xf = x.float() if qw.perm is None else x.float()[:, qw.perm.long()]
    ref = xf @ w_ref + bias.float()
    out = torch.full((M, qw.out_features), float("nan"), device="cuda", dtype=dtype)
    y = quant_matmul_triton(x, qw, bias, out=out)
    torch.cuda.synchronize()
    assert not torch.isnan(y).any(), "unwritten output elements"
    err = ((y.float() - ref).norm() / ref.norm()).item()
    assert err <= tol, f"M={M}: relative error {err:.2e} > {tol}"


@pytest.mark.parametrize("bits,group,asym,act", FORMATS,
                         ids=[f"w{b}-g{g}-{'asym' if a else 'sym'}{'-act' if o else ''}" for b, g, a, o in FORMATS])
def test_formats_real_shapes(bits, group, asym, act):
    # W4 g128 runs every shape; the others rotate through the shapes to bound the run time
    shapes = SHAPES if (bits, group) == (4, 128) else [SHAPES[FORMATS.index((bits, group, asym, act)) % 3]]
    for K, N in shapes:
        qw = make_weight(K, N, bits, group, asym, act, seed=K + N + bits + group)
        w_ref = dequantize(qw, torch.float32)
        for M in MS:
            check(qw, w_ref, M, seed=M)


def test_bf16_activations_and_scales():
    qw = make_weight(4096, 4096, 4, 128, True, True, seed=11, scale_dtype=torch.bfloat16)
    w_ref = dequantize(qw, torch.float32)
    for M in MS:
        check(qw, w_ref, M, seed=M, dtype=torch.bfloat16, tol=1e-2)


def test_split_k_counters_reset_and_graph_replay():
    from edgellm.kernels.triton.common import split_k_locks
    from edgellm.kernels.triton.dispatch import quant_matmul_triton

    qw = make_weight(4096, 4096, 4, 128, True, False, seed=3)
    x = torch.randn(1, 4096, device="cuda", dtype=torch.float16)
    y0 = quant_matmul_triton(x, qw)
    graph = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        quant_matmul_triton(x, qw)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(graph):
        y = quant_matmul_triton(x, qw)
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, y0)
    assert int(split_k_locks(x.device).abs().sum()) == 0


# gemv_h2 (fp16x2 inline-PTX GEMV, fp16 x, M = 1) called directly: every group size, sym/asym,
# act-order, partial last group (K % group != 0), odd N, both tile widths, split-K on and off, the
# register pipeline 1 and 2 blocks ahead.
H2_CASES = [
    # (bits, group, asym, act, K, N, block_n, block_k, split, warps, stages: 3 = loads 2 blocks ahead)
    (4, 128, True, False, 4096, 4096, 256, 128, 4, 4, 3),
    (4, 128, False, False, 4096, 11008, 256, 64, 8, 2, 2),
    (4, 128, True, True, 11008, 4096, 256, 256, 16, 8, 3),
    (4, 128, False, True, 4096, 4096, 128, 128, 1, 4, 2),
    (4, 32, True, False, 4096, 4096, 256, 128, 4, 4, 3),
    (4, 32, False, True, 11008, 4096, 256, 128, 8, 4, 2),
    (4, 64, True, True, 4096, 11008, 256, 128, 2, 4, 3),
    (4, 64, False, False, 4096, 4096, 128, 256, 4, 4, 2),
    (4, -1, True, False, 11008, 4096, 256, 256, 8, 8, 3),
    (4, -1, False, True, 4096, 4096, 128, 256, 1, 4, 2),
    (4, 128, True, False, 4000, 4096, 256, 128, 4, 4, 3),  # partial last group, K % block_k != 0
    (4, 128, True, True, 4000, 4097, 256, 128, 4, 4, 2),  # odd N too
    (4, 64, False, False, 1000, 333, 128, 128, 2, 4, 3),
    (4, 32, True, False, 1003, 1001, 256, 64, 3, 2, 2),  # odd K: per-element x loads
    (8, 128, True, False, 4096, 4096, 256, 64, 4, 4, 3),
    (8, 128, False, True, 11008, 4096, 256, 64, 8, 4, 2),
    (8, 64, True, False, 4000, 4097, 128, 128, 2, 4, 3),
    (8, -1, True, True, 4096, 11008, 256, 32, 4, 2, 2),
]


@pytest.mark.parametrize("bits,group,asym,act,K,N,bn,bk,split,warps,stages", H2_CASES,
                         ids=[f"w{c[0]}-g{c[1]}-{'asym' if c[2] else 'sym'}{'-act' if c[3] else ''}-{c[4]}x{c[5]}"
                              f"-{c[6]}x{c[7]}s{c[8]}w{c[9]}d{c[10] - 1}" for c in H2_CASES])
def test_gemv_h2_direct(bits, group, asym, act, K, N, bn, bk, split, warps, stages):
    from edgellm.kernels.triton.gemv_h2 import gemv_h2_supported, quant_gemv_h2

    qw = make_weight(K, N, bits, group, asym, act, seed=K + N + bits + group)
    assert gemv_h2_supported(qw, bn, bk, warps, torch.float16, 1)
    w_ref = dequantize(qw, torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(K)
    for bias_on in (True, False):
        x = torch.randn(1, K, generator=gen, device="cuda").half()
        bias = torch.randn(N, generator=gen, device="cuda").half() if bias_on else None
        xf = x.float() if qw.perm is None else x.float()[:, qw.perm.long()]
        ref = xf @ w_ref + (bias.float() if bias_on else 0.0)
        out = torch.full((1, N), float("nan"), device="cuda", dtype=torch.float16)
        y = quant_gemv_h2(x, qw, bias, block_n=bn, block_k=bk, split_k=split, num_warps=warps, num_stages=stages,
                          out=out)
        torch.cuda.synchronize()
        assert not torch.isnan(y).any(), "unwritten output elements"
        err = ((y.float() - ref).norm() / ref.norm()).item()
        assert err <= 2e-3, f"relative error {err:.2e} > 2e-3"


def test_gemv_h2_strided_x_and_dispatch():
    """x not contiguous (per-element loads), and the dispatcher: fp16 M=1 may pick gemv_h2; bf16 and act-order never."""
    from edgellm.kernels.triton import dispatch
    from edgellm.kernels.triton.gemv_h2 import quant_gemv_h2
    from edgellm.kernels.triton.table import DispatchTable, KernelChoice, shape_key

    qw = make_weight(4096, 4096, 4, 128, True, False, seed=5)
    w_ref = dequantize(qw, torch.float32)
    xb = torch.randn(4096, 2, device="cuda").half()
    x = xb[:, 0].unsqueeze(0)  # stride (1, 2)
    y = quant_gemv_h2(x, qw, None, block_n=256, block_k=128, split_k=4, num_warps=4, num_stages=2)
    ref = x.float() @ w_ref
    assert ((y.float() - ref).norm() / ref.norm()).item() <= 2e-3
    h2 = KernelChoice("gemv_h2", 1, 256, 128, 4, 4, 2)
    table = DispatchTable(gpu="test", entries={shape_key(4, 128, 4096, 4096): {1: h2}})
    assert dispatch.choose_kernel(qw, 1, table, 132, torch.float16) == h2
    assert dispatch.choose_kernel(qw, 1, table, 132, torch.bfloat16).kernel == "gemv"
    ident = torch.arange(4096, device="cuda", dtype=torch.int32)
    act = QuantizedWeight(qw.qweight, qw.scales, qw.zeros, 4, 128, ident, 4096)
    assert dispatch.choose_kernel(act, 1, table, 132, torch.float16).kernel == "gemv"  # act-order keeps the fp32 GEMV
    check(qw, w_ref, 1, seed=1)  # through the shipped table
    check(qw, w_ref, 1, seed=2, dtype=torch.bfloat16, tol=1e-2)
