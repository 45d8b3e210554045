"""`edgellm bench latency MODEL`: time to first token, time per output token and end-to-end latency of
one batch (vLLM's `benchmark_latency.py` shape), next to HF transformers `generate` in the same run.

edgellm: the batch's requests are streamed through LLMEngine (stream=True); TTFT is the time to
the first step that returns tokens for every request, TPOT the rest divided by output_len − 1.
HF: `generate` with max_new_tokens=1 gives its TTFT, the full `generate` its end-to-end time.
Median over `--iters` runs after one warm-up.
"""

from __future__ import annotations

import random
import statistics
import time

import click

from edgellm.bench.throughput import header


def time_edgellm(engine, prompts: list[list[int]], output_len: int) -> tuple[float, float]:
    """(TTFT, end-to-end) seconds for one batch."""
    from edgellm.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    for i, p in enumerate(prompts):
        engine.add_request(f"lat{i}", p, params, stream=True)
    ttft, started = None, set()
    while engine.has_unfinished_requests():
        started.update(out.request_id for out in engine.step() if out.outputs[0].token_ids)
        if ttft is None and len(started) == len(prompts):
            ttft = time.perf_counter() - start
    return ttft, time.perf_counter() - start


def time_hf(model, prompts: list[list[int]], output_len: int, pad_id: int) -> tuple[float, float]:
    import torch

    ids = torch.tensor(prompts)  # equal lengths: no padding
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=pad_id)
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=1, **kwargs)
    ttft = time.perf_counter() - start
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=output_len, **kwargs)
    return ttft, time.perf_counter() - start


@click.command("latency")
@click.argument("model")
@click.option("--input-len", default=128, show_default=True)
@click.option("--output-len", default=128, show_default=True)
@click.option("--batch-size", default="1,8", show_default=True, help="Comma list of batch sizes.")
@click.option("--iters", default=3, show_default=True, help="Timed runs per row (median reported).")
@click.option("--hf/--no-hf", default=True, show_default=True, help="Also time HF transformers `generate`.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "float16", "bfloat16"]))
@click.option("--threads", default=None, type=int, help="torch threads (default: torch's choice).")
@click.option("--seed", default=0, show_default=True)
def latency(model: str, input_len: int, output_len: int, batch_size: str, iters: int, hf: bool, device: str,
            dtype: str, threads: int | None, seed: int) -> None:
    """Latency of one batch on MODEL (a directory or a pulled name) next to HF transformers `generate`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from edgellm.engine.engine import LLMEngine, engine_config_from_args
    from edgellm.hub.pull import resolve_model

    if threads:
        torch.set_num_threads(threads)
    try:
        path = resolve_model(model)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    sizes = [int(b) for b in batch_size.split(",") if b.strip()]
    tok = AutoTokenizer.from_pretrained(path)
    rng = random.Random(seed)
    ordinary = [t for t in range(len(tok)) if t not in set(tok.all_special_ids)]
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    engine = LLMEngine(engine_config_from_args(str(path), device, dtype, max_num_seqs=max(sizes),
                                               max_model_len=input_len + output_len, enable_prefix_caching=False))
    hf_model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(device).eval() if hf else None
    print(header(model, device, dtype))
    rows = []
    for b in sizes:
        prompts = [[rng.choice(ordinary) for _ in range(input_len)] for _ in range(b)]
        runners = [("edgellm `LLMEngine`", lambda: time_edgellm(engine, prompts, output_len))]
        if hf_model is not None:
            runners.append(("HF transformers `generate`", lambda: time_hf(hf_model, prompts, output_len, pad)))
        for name, fn in runners:
            fn()  # warm-up
            ttft, e2e = (statistics.median(x) for x in zip(*(fn() for _ in range(iters))))
            tpot = (e2e - ttft) / max(output_len - 1, 1)
            rows.append(f"| {name} | {b} | {input_len} | {output_len} | {ttft * 1e3:.0f} | {tpot * 1e3:.1f} | "
                        f"{e2e:.2f} | {b * output_len / e2e:.1f} |")
    print()
    print("| runner | batch | prompt | output | TTFT ms | TPOT ms | end-to-end s | output tok/s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
