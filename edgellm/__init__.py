"""edgellm: quantized LLMs, fast on the GPUs people own and on a plain CPU."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("edgellm")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"


def __getattr__(name: str):
    # Lazy: `import edgellm` stays cheap for the CLI's --help and --version.
    if name == "load_model":
        from edgellm.loader.load import load_model

        return load_model
    if name == "LLM":
        from edgellm.llm import LLM

        return LLM
    if name == "SamplingParams":
        from edgellm.engine.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'edgellm' has no attribute {name!r}")
