"""The `edgellm` command line (click)."""

import click

from edgellm import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgellm")
def main() -> None:
    """edgellm: quantized LLMs on small GPUs and plain CPUs."""


from edgellm.cli.bench import bench  # noqa: E402
from edgellm.cli.eval import eval_group  # noqa: E402  (commands register after the group exists)
from edgellm.cli.generate import generate  # noqa: E402
from edgellm.cli.pull import pull  # noqa: E402

main.add_command(pull)
main.add_command(bench)
main.add_command(eval_group)
main.add_command(generate)
