"""`edgellm eval`: model quality measurements (`eval ppl`: sliding-window perplexity)."""

from __future__ import annotations

from pathlib import Path

import click

DTYPE_NAMES = ("auto", "float32", "float16", "bfloat16")


@click.group("eval")
def eval_group() -> None:
    """Measure model quality."""


@eval_group.command("ppl")
@click.argument("model")
@click.option("--text", "text_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="UTF-8 text file to score.")  # fmt: skip
@click.option("--window", default=1024, show_default=True, help="Tokens per forward pass.")
@click.option("--stride", default=512, show_default=True,
              help="Tokens between window starts; each window's first window-stride tokens are context only.")  # fmt: skip
@click.option("--device", default=None, help="torch device  [default: cuda if available, else cpu]")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="auto", show_default=True,
              help="Compute dtype; auto = float16 on a GPU, float32 on the CPU.")  # fmt: skip
def ppl(model: str, text_path: Path, window: int, stride: int, device: str | None, dtype: str) -> None:
    """Perplexity of MODEL (a directory, a pulled name or a cached hub id) on a text file."""
    import torch
    from tokenizers import Tokenizer

    from edgellm import load_model
    from edgellm.hub.pull import resolve_model
    from edgellm.perplexity import compute_perplexity

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else "float16"
    try:
        path = resolve_model(model)
        tokenizer_file = path / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise FileNotFoundError(f"{tokenizer_file}: expected a tokenizers file beside the checkpoint, got none")
        token_ids = Tokenizer.from_file(str(tokenizer_file)).encode(text_path.read_text(encoding="utf-8")).ids
        lm = load_model(path, device=device, dtype=getattr(torch, dtype))
        result = compute_perplexity(lm, token_ids, window=window, stride=stride, device=device, show_progress=True)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(
        f"perplexity {result.perplexity:.4f} on {text_path} ({result.num_tokens} tokens, "
        f"{result.num_scored_tokens} scored in {result.num_windows} windows of {window}, stride {stride}; "
        f"{model}, {device}, {dtype})"
    )
