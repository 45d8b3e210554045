"""`edgellm bench ...`: benchmarks that print markdown tables (kernels here; throughput and latency in edgellm/bench)."""

from __future__ import annotations

import click


@click.group()
def bench() -> None:
    """Benchmarks that print markdown tables for docs/benchmarks.md."""


@bench.command("kernels")
@click.option("--models", default="llama2-7b", show_default=True,
              help="comma list of llama2-7b, llama3-8b, qwen2.5-7b")
@click.option("--m", "ms", default="1,4,16,64,256,1024", show_default=True, help="comma list of token counts M")
@click.option("--bits", default=4, show_default=True, type=click.Choice(["2", "3", "4", "8"]))
@click.option("--group-size", default=128, show_default=True, type=int)
@click.option("--sym/--asym", default=False, show_default=True)
@click.option("--tune/--no-tune", default=True, show_default=True,
              help="time candidates for shapes missing from the dispatch table (warm-up), save to $EDGELLM_HOME")
@click.option("--formats/--no-formats", default=False, show_default=True,
              help="also time the Llama-2-7B stack in the other formats (act-order, g32/64/-1, W8, W3, W2)")
@click.option("--save-table", type=click.Path(dir_okay=False), default=None,
              help="write this GPU's merged dispatch table (shipped + tuned) to this JSON file")
@click.option("--markdown", type=click.Path(dir_okay=False), default=None, help="also write the tables here")
@click.option("--csv", "csv_path", type=click.Path(dir_okay=False), default=None, help="per-row results as CSV")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help="everything as JSON")
def kernels(models: str, ms: str, bits: str, group_size: int, sym: bool, tune: bool, formats: bool,
            save_table: str | None, markdown: str | None, csv_path: str | None, json_path: str | None) -> None:
    """quant_matmul vs fp16 cuBLAS and torch int4 on a model's linear shapes (needs CUDA)."""
    import torch

    if not torch.cuda.is_available():
        raise click.ClickException("bench kernels: needs a CUDA GPU; none is visible")
    from edgellm.bench import kernels as kb

    lines: list[str] = []

    def log(s: str) -> None:
        print(s, flush=True)
        lines.append(s)

    model_list = [m.strip() for m in models.split(",") if m.strip()]
    for m in model_list:
        if m not in kb.MODEL_SHAPES:
            raise click.BadParameter(f"--models: expected one of {sorted(kb.MODEL_SHAPES)}, got {m!r}")
    result = kb.run(model_list, [int(v) for v in ms.split(",")], int(bits), group_size, sym, tune, formats, log)
    if save_table:
        from pathlib import Path

        from edgellm.kernels.triton import dispatch
        from edgellm.kernels.triton.table import write_table

        write_table(dispatch.device_table(torch.device("cuda")), Path(save_table))
    if markdown:
        with open(markdown, "w") as f:
            f.write("\n".join(lines) + "\n")
    if csv_path:
        kb.write_csv(result, csv_path)
    if json_path:
        kb.write_json(result, json_path)


from edgellm.bench.latency import latency  # noqa: E402  (engine benchmarks: click commands beside their code)
from edgellm.bench.throughput import throughput  # noqa: E402

bench.add_command(throughput)
bench.add_command(latency)
