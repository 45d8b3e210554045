"""`edgellm generate MODEL -p PROMPT`: one chat turn (or a raw prompt), streamed to the terminal."""

from __future__ import annotations

import click

DTYPE_NAMES = ("auto", "float32", "float16", "bfloat16")


@click.command("generate")
@click.argument("model")
@click.option("-p", "--prompt", required=True, help="The user message (or the raw prompt with --raw).")
@click.option("--system", default=None, help="A system message placed before the prompt.")
@click.option("--raw", is_flag=True, help="Send the prompt as is, without the chat template.")
@click.option("--max-tokens", default=256, show_default=True, help="Most tokens to generate.")
@click.option("--temperature", default=0.7, show_default=True, help="0 = greedy.")
@click.option("--top-p", default=0.95, show_default=True)
@click.option("--seed", default=None, type=int, help="Seed for a reproducible sample.")
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda or cuda:N")
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="auto", show_default=True,
              help="auto = float32 on the CPU, float16 on a GPU.")  # fmt: skip
@click.option("--max-model-len", default=4096, show_default=True, help="Prompt + output limit (sizes the KV cache).")
def generate(model: str, prompt: str, system: str | None, raw: bool, max_tokens: int, temperature: float,
             top_p: float, seed: int | None, device: str, dtype: str, max_model_len: int) -> None:
    """Generate a reply from MODEL (a directory, a pulled name or a cached hub id), streaming it."""
    import logging

    from edgellm.engine.engine import LLMEngine, engine_config_from_args
    from edgellm.engine.sampling_params import SamplingParams

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        params = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed)
        engine = LLMEngine(engine_config_from_args(model, device, dtype, max_num_seqs=1, max_model_len=max_model_len))
        tok = engine.tokenizer
        if raw:
            engine.add_request("cli", prompt, params, stream=True)
        else:
            if tok.chat_template is None:
                raise ValueError(f"{model}: the tokenizer has no chat template; pass --raw to send the prompt as is")
            messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
            text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            engine.add_request("cli", text, params, stream=True, add_special_tokens=False)
    except (ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    finish = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            click.echo(out.outputs[0].text, nl=False)
            finish = out.outputs[0].finish_reason
    click.echo()
    if finish == "length":
        click.echo(f"[stopped at --max-tokens {max_tokens}]", err=True)
