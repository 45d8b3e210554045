"""`edgellm bench throughput MODEL`: offline engine throughput vs HF transformers `generate`, one run.

N requests with random token prompts and random output lengths (uniform in
[len * (1 - range_ratio), len * (1 + range_ratio)], fixed seed, ignore_eos), as vLLM's
`benchmark_throughput.py` random dataset:

* edgellm: all N requests handed to `LLM.generate` at once, at each `--concurrency`
  (= max_num_seqs: the engine keeps that many in flight, refilling as requests finish);
* HF transformers on the same checkpoint, dtype and threads: `generate` at batch 1 on each
  request, and padded batches of `--hf-batch` (left padding; each batch generates its
  longest output, so shorter requests pay for padding). Only the tokens each request asked
  for are counted, so both sides are credited the same work.

Runs one request at a time (batch 1, concurrency 1) take only the first
`--serial-prompts` requests: their rate does not depend on how many follow, and
they are the slow rows.

Prints a markdown table: requests/s, output tokens/s, total (prompt + output) tokens/s, and each
row's host memory: the peak growth of this process's resident set during the row (edgellm: building
the engine, weights, KV pool and generation; HF: its model load, measured once, plus generation).
"""

from __future__ import annotations

import ctypes
import gc
import platform
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import click
import psutil


@dataclass(slots=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def num_prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)


@dataclass(slots=True)
class Result:
    runner: str
    batch: str
    seconds: float
    work: Workload
    peak_rss_bytes: int  # growth of the resident set over the row, see the module docstring

    def row(self, base_tok_s: float | None) -> str:
        n = len(self.work.prompts)
        out_s = self.work.num_output_tokens / self.seconds
        total_s = (self.work.num_prompt_tokens + self.work.num_output_tokens) / self.seconds
        ratio = f"{out_s / base_tok_s:.2f}x" if base_tok_s else "-"
        mib = self.peak_rss_bytes / 2**20
        return (f"| {self.runner} | {self.batch} | {n} | {n / self.seconds:.3f} | {out_s:.1f} | {total_s:.1f} | {ratio} "
                f"| {mib:,.0f} |")


def measure_peak_rss(fn: Callable[[], float]) -> tuple[float, int]:
    """Run fn; return its result and the peak growth of the process RSS while it ran (sampled every 5 ms)."""
    # The previous row's engine must be gone and its pages returned to the OS, or the allocator
    # reuses them and hides this row's growth.
    gc.collect()
    if platform.system() == "Linux":
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    proc = psutil.Process()
    start = proc.memory_info().rss
    peak = start
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, proc.memory_info().rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = fn()
    finally:
        done.set()
        sampler.join()
    return result, max(peak, proc.memory_info().rss) - start


def make_workload(vocab_size: int, special_ids: set[int], num: int, input_len: int, output_len: int,
                  range_ratio: float, seed: int) -> Workload:
    rng = random.Random(seed)
    ordinary = [t for t in range(vocab_size) if t not in special_ids]

    def length(mean: int) -> int:
        return max(1, rng.randint(int(mean * (1 - range_ratio)), int(mean * (1 + range_ratio))))

    prompts = [[rng.choice(ordinary) for _ in range(length(input_len))] for _ in range(num)]
    return Workload(prompts, [length(output_len) for _ in range(num)])


def run_edgellm(model: str, device: str, dtype: str, work: Workload, concurrency: int, max_model_len: int,
                progress: bool) -> float:
    from edgellm.engine.sampling_params import SamplingParams
    from edgellm.llm import LLM

    llm = LLM(model, device, dtype, max_num_seqs=concurrency, max_model_len=max_model_len,
              enable_prefix_caching=False)  # random prompts share nothing; keep the hash work out of it
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work.output_lens]
    llm.generate(work.prompts[:1], SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    start = time.perf_counter()
    outs = llm.generate(work.prompts, params, use_tqdm=progress)
    seconds = time.perf_counter() - start
    assert [len(o.outputs[0].token_ids) for o in outs] == work.output_lens
    return seconds


def run_hf(hf_model, work: Workload, batch: int, pad_id: int, progress: bool) -> float:
    import torch

    from tqdm.auto import tqdm

    order = range(0, len(work.prompts), batch)
    start = time.perf_counter()
    for i in tqdm(order, desc=f"HF batch {batch}", unit="batch", disable=not progress):
        prompts, lens = work.prompts[i : i + batch], work.output_lens[i : i + batch]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = hf_model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens), do_sample=False,
                                eos_token_id=None, pad_token_id=pad_id)
        assert out.shape[1] == width + max(lens)
    return time.perf_counter() - start


def header(model: str, device: str, dtype: str) -> str:
    import torch
    import transformers

    from edgellm import __version__

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{model} on {device} ({cpu}, {torch.get_num_threads()} threads), {dtype}; edgellm {__version__}, "
            f"torch {torch.__version__}, transformers {transformers.__version__}, {time.strftime('%Y-%m-%d %H:%M %Z')}")


@click.command("throughput")
@click.argument("model")
@click.option("--num-prompts", default=64, show_default=True, help="Requests in each run.")
@click.option("--serial-prompts", default=16, show_default=True,
              help="Requests in the one-at-a-time rows (HF batch 1, concurrency 1).")
@click.option("--input-len", default=128, show_default=True, help="Mean prompt length (tokens).")
@click.option("--output-len", default=128, show_default=True, help="Mean output length (tokens).")
@click.option("--range-ratio", default=0.5, show_default=True, help="Lengths uniform in len * (1 ± ratio).")
@click.option("--concurrency", default="1,16", show_default=True, help="Comma list of max_num_seqs to run.")
@click.option("--hf-batch", default="1,16", show_default=True, help="Comma list of HF generate batch sizes (empty: skip).")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16", "bfloat16"]))
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's choice).")
@click.option("--seed", default=0, show_default=True)
@click.option("--progress/--no-progress", default=True, show_default=True)
def throughput(model: str, num_prompts: int, serial_prompts: int, input_len: int, output_len: int, range_ratio: float, concurrency: str,
               hf_batch: str, device: str, dtype: str, threads: int | None, seed: int, progress: bool) -> None:
    """Engine throughput on MODEL (a directory or a pulled name) next to HF transformers `generate`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgellm.hub.pull import resolve_model

    if threads:
        torch.set_num_threads(threads)
    try:
        path = resolve_model(model)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    concurrencies = [int(c) for c in concurrency.split(",") if c.strip()]
    hf_batches = [int(b) for b in hf_batch.split(",") if b.strip()]
    tok = AutoTokenizer.from_pretrained(path)
    work = make_workload(len(tok), set(tok.all_special_ids), num_prompts, input_len, output_len, range_ratio, seed)
    max_model_len = max(len(p) + n for p, n in zip(work.prompts, work.output_lens))
    print(header(model, device, dtype))
    print(f"{num_prompts} requests (one-at-a-time rows: the first {serial_prompts}): "
          f"prompt {input_len} ± {range_ratio:.0%}, output {output_len} ± {range_ratio:.0%} "
          f"tokens ({work.num_prompt_tokens} prompt + {work.num_output_tokens} output), greedy, ignore_eos")

    results: list[Result] = []
    serial = Workload(work.prompts[:serial_prompts], work.output_lens[:serial_prompts])
    hf, hf_load_bytes = None, 0
    if hf_batches:
        def load_hf() -> object:
            return AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval()

        hf, hf_load_bytes = measure_peak_rss(load_hf)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if hf is not None:
        run_hf(hf, Workload(work.prompts[:1], [4]), 1, pad, False)  # warm-up
    # Each size runs HF then edgellm back to back, so both see the same load on a shared machine.
    for size in sorted(set(hf_batches) | set(concurrencies)):
        w = serial if size == 1 else work
        if size in hf_batches:
            seconds, grown = measure_peak_rss(lambda: run_hf(hf, w, size, pad, progress))
            batch = f"batch {size}" + (" (padded)" if size > 1 else "")
            results.append(Result("HF transformers `generate`", batch, seconds, w, hf_load_bytes + grown))
        if size in concurrencies:
            seconds, grown = measure_peak_rss(lambda: run_edgellm(str(path), device, dtype, w, size, max_model_len, progress))
            results.append(Result("edgellm `LLM.generate`", f"{size} concurrent", seconds, w, grown))

    base = next((r for r in results if r.batch == "batch 1"), None)
    base_tok_s = base.work.num_output_tokens / base.seconds if base else None
    print()
    print("| runner | batch | requests | requests/s | output tok/s | total tok/s | output vs HF batch 1 | peak host MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(r.row(base_tok_s))
