"""`edgellm bench kernels`: quant_matmul against fp16 cuBLAS and torch's int4 kernel.

For each linear shape of a model (K x N) and each M, times with CUDA-graph replays over
enough rotated weight copies that the working set is 3x the L2:

    edgellm     edgellm.kernels quant_matmul (the dispatch table's choice), W4 g128 by default
    fp16        x @ w.t() through cuBLAS, w [N, K] fp16
    torch-int4  torch._weight_int4pack_mm (g128, bf16 activations; tinygemm)

(gemlite is not installed on the benchmark machine and has no wheel here; docs/benchmarks.md
quotes anchors.md's gemlite figures, marked as from an earlier run.)

and prints µs, achieved GB/s (weights + x + y bytes over time), speedup over fp16, the sum over
the whole layer stack per step, the card's copy/read bandwidth and the roofline fraction.
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import pack_codes, quant_matmul_ref

# (name, K, N) per layer; layer count
MODEL_SHAPES: dict[str, tuple[int, list[tuple[str, int, int]]]] = {
    "llama2-7b": (32, [("qkv", 4096, 12288), ("o", 4096, 4096), ("gate_up", 4096, 22016), ("down", 11008, 4096)]),
    "llama3-8b": (32, [("qkv", 4096, 6144), ("o", 4096, 4096), ("gate_up", 4096, 28672), ("down", 14336, 4096)]),
    "qwen2.5-7b": (28, [("qkv", 3584, 4608), ("o", 3584, 3584), ("gate_up", 3584, 37888), ("down", 18944, 3584)]),
}
DEFAULT_MS = (1, 4, 16, 64, 256, 1024)
# (label, bits, group_size, sym, act_order): the formats row set of --formats
EXTRA_FORMATS = (
    ("W4 g128 asym act-order", 4, 128, False, True),
    ("W4 g128 sym", 4, 128, True, False),
    ("W4 g32 asym", 4, 32, False, False),
    ("W4 g64 asym", 4, 64, False, False),
    ("W4 per-channel asym", 4, -1, False, False),
    ("W8 g128 asym", 8, 128, False, False),
    ("W3 g128 asym (4-bit containers)", 3, 128, False, False),
    ("W2 g64 sym", 2, 64, True, False),
)


@dataclass(slots=True)
class Row:
    model: str
    shape: str
    K: int
    N: int
    M: int
    kernel: str
    us: float
    gbps: float
    choice: str = ""


def random_weight(K: int, N: int, bits: int, group_size: int, sym: bool, act_order: bool, device: torch.device,
                  scale_dtype: torch.dtype = torch.float16, seed: int = 0) -> tuple[QuantizedWeight, str]:
    """A random QuantizedWeight, sent through the GPTQ converter (from_internal -> to_internal) when it exists.

    bits=3 gives 3-bit codes in 4-bit containers with explicit zeros (what the loader makes).
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    g = K if group_size == -1 else group_size
    G = -(-K // g)
    code_bits = bits
    container = 4 if bits == 3 else bits
    codes = torch.randint(0, 2**code_bits, (K, N), generator=gen, device=device, dtype=torch.int32)
    scales = (torch.rand(G, N, generator=gen, device=device) * 0.01 + 0.002).to(scale_dtype)
    if sym and bits != 3:
        zeros = None
    elif sym:
        zeros = torch.full((G, N), 4.0, device=device, dtype=scale_dtype)
    else:
        zeros = torch.randint(0, 2**code_bits, (G, N), generator=gen, device=device).to(scale_dtype)
    perm = torch.randperm(K, generator=gen, device=device).to(torch.int32) if act_order else None
    qw = QuantizedWeight(pack_codes(codes, container), scales, zeros, container, g, perm, K)
    try:
        from edgellm.quant.formats import gptq
        from edgellm.quant.spec import QuantMethod, QuantSpec

        spec = QuantSpec(QuantMethod.GPTQ, bits, group_size, sym, act_order, "gptq")
        tensors = gptq.from_internal(qw, spec)
        back = gptq.to_internal(tensors, spec, "bench", K, N).to(device)
        return back, "GPTQ converter (from_internal -> to_internal)"
    except ImportError:
        return qw, "kernels.reference.pack_codes (GPTQ converter not importable)"


def _tensor_bytes(*ts: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in ts if t is not None)


def measure_bandwidth(device: torch.device, gib: float = 2.0) -> tuple[float, float]:
    """(copy GB/s counting read + write, read GB/s of a sum), median of 10."""
    from edgellm.kernels.triton.tune import time_cuda_graph

    n = int(gib * (1 << 30)) // 2
    src = torch.randn(n, device=device, dtype=torch.float16)
    dst = torch.empty_like(src)
    copy_us = time_cuda_graph([lambda: dst.copy_(src)], reps=10)
    out = torch.empty((), device=device, dtype=torch.float32)
    read_us = time_cuda_graph([lambda: torch.sum(src, dim=0, dtype=torch.float32, out=out)], reps=10)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n * 2 / copy_us / 1e3, n * 2 / read_us / 1e3


def _copies(nbytes: int, l2: int) -> int:
    return max(2, min(64, int(3 * l2 / max(1, nbytes)) + 1))


def time_edgellm(qw: QuantizedWeight, M: int, dtype: torch.dtype, l2: int) -> tuple[float, float, str]:
    from edgellm.kernels.triton import dispatch
    from edgellm.kernels.triton.tune import rotated_copies, time_cuda_graph

    copies = rotated_copies(qw, l2)
    x = torch.randn(M, qw.in_features, dtype=dtype, device=qw.device)
    table = dispatch.device_table(qw.device)
    choice = dispatch.choose_kernel(qw, M, table, dispatch.device_num_sms(qw.device), dtype)
    us = time_cuda_graph([lambda w=w: dispatch.run_choice(choice, x, w, None) for w in copies])
    nbytes = qw.nbytes() + _tensor_bytes(x) + M * qw.out_features * x.element_size()
    c = choice
    desc = c.kernel if c.kernel == "dequant_mm" else f"{c.kernel} {c.block_m}x{c.block_n}x{c.block_k} s{c.split_k} w{c.num_warps}"
    return us, nbytes / us / 1e3, desc


def time_fp16(K: int, N: int, M: int, device: torch.device, l2: int) -> tuple[float, float]:
    from edgellm.kernels.triton.tune import time_cuda_graph

    n = _copies(N * K * 2, l2)
    ws = [torch.randn(N, K, device=device, dtype=torch.float16) * 0.02 for _ in range(n)]
    x = torch.randn(M, K, device=device, dtype=torch.float16)
    us = time_cuda_graph([lambda w=w: x @ w.t() for w in ws])
    return us, (N * K * 2 + M * K * 2 + M * N * 2) / us / 1e3


def time_torch_int4(K: int, N: int, M: int, device: torch.device, l2: int, group: int = 128) -> tuple[float, float] | None:
    """torch._weight_int4pack_mm (tinygemm), bf16 activations; None where this torch lacks it."""
    from edgellm.kernels.triton.tune import time_cuda_graph

    try:
        n = _copies(N * K // 2, l2)
        packed = []
        for _ in range(n):
            q = torch.randint(0, 16, (N, K), device=device, dtype=torch.int32)
            q_u8 = (q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8)
            packed.append(torch.ops.aten._convert_weight_to_int4pack(q_u8, 8))
        sz = torch.rand(K // group, N, 2, device=device, dtype=torch.bfloat16) * 0.01
        x = torch.randn(M, K, device=device, dtype=torch.bfloat16)
        fns = [lambda p=p: torch.ops.aten._weight_int4pack_mm(x, p, group, sz) for p in packed]
        us = time_cuda_graph(fns)
    except (RuntimeError, AttributeError) as e:
        print(f"torch int4: not available ({str(e).splitlines()[0][:120]})")
        return None
    return us, (N * K // 2 + sz.numel() * 2 + M * K * 2 + M * N * 2) / us / 1e3


def check_correct(qw: QuantizedWeight, dtype: torch.dtype) -> float:
    from edgellm.kernels.triton.dispatch import quant_matmul_triton

    worst = 0.0
    for M in (1, 16, 256):
        x = torch.randn(M, qw.in_features, device=qw.device, dtype=dtype)
        ref = quant_matmul_ref(x.float(), qw).float()
        y = quant_matmul_triton(x, qw).float()
        worst = max(worst, ((y - ref).norm() / ref.norm()).item())
    return worst


def run(models: list[str], ms: list[int], bits: int, group_size: int, sym: bool, tune: bool, formats: bool,
        log: Callable[[str], None] = print) -> dict:
    from edgellm.kernels.triton import dispatch
    from edgellm.kernels.triton.table import M_BUCKETS, gpu_file_name
    from edgellm.kernels.triton.tune import l2_cache_bytes, warmup

    import triton

    device = torch.device("cuda")
    torch.cuda.reset_peak_memory_stats(device)
    props = torch.cuda.get_device_properties(device)
    l2 = l2_cache_bytes(device)
    header = {
        "gpu": torch.cuda.get_device_name(device), "sms": props.multi_processor_count, "l2_mb": l2 / 2**20,
        "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "table": gpu_file_name(device),
    }
    copy_gbps, read_gbps = measure_bandwidth(device)
    header["copy_gbps"], header["read_gbps"] = round(copy_gbps), round(read_gbps)
    log(f"# edgellm bench kernels — {header['gpu']} ({header['sms']} SMs, L2 {header['l2_mb']:.0f} MB), "
        f"torch {header['torch']}, triton {header['triton']}, {header['date']}")
    log(f"measured bandwidth: copy {copy_gbps:,.0f} GB/s (read+write), read {read_gbps:,.0f} GB/s")

    rows: list[Row] = []
    summary = {}
    for model in models:
        layers, shapes = MODEL_SHAPES[model]
        weights = {}
        for name, K, N in shapes:
            qw, how = random_weight(K, N, bits, group_size, sym, False, device)
            weights[name] = qw
        log(f"\n## {model}: W{bits} g{group_size} {'sym' if sym else 'asym'}; weights built with {how}")
        t0 = time.perf_counter()
        report = warmup(weights.values(), M_BUCKETS, torch.float16, tune=tune, log=log)
        log(f"warm-up: {time.perf_counter() - t0:.1f} s ({report.num_shapes_tuned} shapes tuned in {report.tune_s:.1f} s, "
            f"{report.num_shapes_cached} from the table; compile/first run {report.compile_s:.1f} s)")
        summary.setdefault("warmup_s", {})[model] = round(time.perf_counter() - t0, 1)
        err = max(check_correct(qw, torch.float16) for qw in weights.values())
        log(f"max relative error vs reference (M=1,16,256): {err:.2e}")
        for name, K, N in shapes:
            qw = weights[name]
            for M in ms:
                us, gbps, desc = time_edgellm(qw, M, torch.float16, l2)
                rows.append(Row(model, name, K, N, M, "edgellm", us, gbps, desc))
                us, gbps = time_fp16(K, N, M, device, l2)
                rows.append(Row(model, name, K, N, M, "fp16", us, gbps))
                r = time_torch_int4(K, N, M, device, l2) if bits == 4 and group_size == 128 else None
                if r is not None:
                    rows.append(Row(model, name, K, N, M, "torch-int4", r[0], r[1]))
            torch.cuda.empty_cache()
        log(layer_table(rows, model, ms, read_gbps))
        log(stack_table(rows, model, ms, layers, read_gbps, shapes, weights))
        summary[model] = stack_summary(rows, model, ms, layers)
        del weights
        torch.cuda.empty_cache()
    if formats:
        log(formats_table(device, l2, dispatch, warmup))
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    log(f"\npeak GPU memory allocated: {peak:.1f} GiB")
    header["peak_gib"] = round(peak, 1)
    return {"header": header, "rows": [asdict(r) for r in rows], "summary": summary}


def _get(rows: list[Row], model: str, shape: str, M: int, kernel: str) -> Row | None:
    for r in rows:
        if (r.model, r.shape, r.M, r.kernel) == (model, shape, M, kernel):
            return r
    return None


def layer_table(rows: list[Row], model: str, ms: list[int], read_gbps: float) -> str:
    kernels = [k for k in ("edgellm", "fp16", "torch-int4") if any(r.kernel == k and r.model == model for r in rows)]
    out = io.StringIO()
    out.write("\n| shape (KxN) | M | " + " | ".join(f"{k} µs (GB/s)" for k in kernels)
              + " | edgellm vs fp16 | edgellm % of read BW | edgellm kernel |\n")
    out.write("|---|---|" + "---|" * len(kernels) + "---|---|---|\n")
    shapes = []
    for r in rows:
        if r.model == model and (r.shape, r.K, r.N) not in shapes:
            shapes.append((r.shape, r.K, r.N))
    for shape, K, N in shapes:
        for M in ms:
            cells = []
            for k in kernels:
                r = _get(rows, model, shape, M, k)
                cells.append("—" if r is None else f"{r.us:.1f} ({r.gbps:,.0f})")
            e, f = _get(rows, model, shape, M, "edgellm"), _get(rows, model, shape, M, "fp16")
            out.write(f"| {shape} {K}x{N} | {M} | " + " | ".join(cells)
                      + f" | {f.us / e.us:.2f}x | {100 * e.gbps / read_gbps:.0f}% | {e.choice} |\n")
    return out.getvalue()


def stack_summary(rows: list[Row], model: str, ms: list[int], layers: int) -> dict:
    res = {}
    for M in ms:
        per = {}
        for r in rows:
            if r.model == model and r.M == M:
                per[r.kernel] = per.get(r.kernel, 0.0) + r.us * layers / 1000.0
        res[M] = {k: round(v, 3) for k, v in per.items()}
    return res


def stack_table(rows: list[Row], model: str, ms: list[int], layers: int, read_gbps: float, shapes, weights) -> str:
    summ = stack_summary(rows, model, ms, layers)
    kernels = [k for k in ("edgellm", "fp16", "torch-int4") if k in summ[ms[0]]]
    wbytes = sum(w.nbytes() for w in weights.values()) * layers
    fbytes = sum(K * N * 2 for _, K, N in shapes) * layers
    out = io.StringIO()
    out.write(f"\n{model}, all {layers} layers' linears per step (ms); roofline at read BW: "
              f"quantized weights {wbytes / read_gbps / 1e6:.2f} ms, fp16 weights {fbytes / read_gbps / 1e6:.2f} ms\n\n")
    out.write("| M | " + " | ".join(f"{k} ms" for k in kernels) + " | edgellm vs fp16 | "
              + " | ".join(f"edgellm vs {k}" for k in kernels if k not in ("edgellm", "fp16")) + " |\n")
    out.write("|---|" + "---|" * len(kernels) + "---|" + "---|" * (len(kernels) - 2) + "\n")
    for M in ms:
        s = summ[M]
        out.write(f"| {M} | " + " | ".join(f"{s[k]:.3f}" for k in kernels) + f" | {s['fp16'] / s['edgellm']:.2f}x | "
                  + " | ".join(f"{s[k] / s['edgellm']:.2f}x" for k in kernels if k not in ("edgellm", "fp16")) + " |\n")
    return out.getvalue()


def formats_table(device: torch.device, l2: int, dispatch, warmup) -> str:
    """Llama-2-7B stack at M=1 and 16 for the other formats, relative to W4 g128 asym."""
    from edgellm.kernels.triton.table import M_BUCKETS

    layers, shapes = MODEL_SHAPES["llama2-7b"]
    ms = (1, 16)
    results = {}
    for label, bits, group, sym, act in (("W4 g128 asym", 4, 128, False, False),) + EXTRA_FORMATS:
        ws = [random_weight(K, N, bits, group, sym, act, device)[0] for _, K, N in shapes]
        warmup(ws, M_BUCKETS, torch.float16, tune=False)
        tot = {}
        for M in ms:
            tot[M] = sum(time_edgellm(w, M, torch.float16, l2)[0] for w in ws) * layers / 1000.0
        results[label] = tot
        del ws
        torch.cuda.empty_cache()
    base = results["W4 g128 asym"]
    out = io.StringIO()
    out.write("\nOther formats, Llama-2-7B linears per step (ms; ratio to W4 g128 asym)\n\n| format | M=1 | M=16 |\n|---|---|---|\n")
    for label, tot in results.items():
        out.write(f"| {label} | " + " | ".join(f"{tot[M]:.3f} ({tot[M] / base[M]:.2f}x)" for M in ms) + " |\n")
    return out.getvalue()


def write_csv(result: dict, path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(Row.__slots__))
        w.writeheader()
        for r in result["rows"]:
            w.writerow(r)


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
