"""EngineConfig, CacheConfig, SchedulerConfig: what the engine is told at startup.

A leaf module (imports nothing from edgellm): the CLI, the server, recipes and
every engine part read these. Names and meanings follow vLLM's. Each config is
frozen and checks itself; a bad value raises one ValueError naming the field
and the allowed range. Use `dataclasses.replace` to derive a changed copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DTYPES = ("auto", "float16", "bfloat16", "float32")


def _check(ok: bool, where: str, allowed: str, value: object) -> None:
    if not ok:
        raise ValueError(f"{where}: expected {allowed}, got {value!r}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    block_size: int = 16  # tokens per KV block; the unit of allocation, hashing and swap
    gpu_memory_utilization: float = 0.9  # share of device memory for weights + activations + KV
    swap_space: float = 4.0  # GiB of pinned CPU memory for swapped-out KV blocks; 0 disables swap
    enable_prefix_caching: bool = True  # reuse full blocks whose chained hash matches (design §4.3)
    num_gpu_blocks_override: int | None = None  # skip the memory profile and use this many device blocks

    def __post_init__(self) -> None:
        pow2 = self.block_size >= 1 and self.block_size & (self.block_size - 1) == 0
        _check(pow2 and self.block_size <= 128, "CacheConfig.block_size", "a power of two in [1, 128]", self.block_size)
        util = self.gpu_memory_utilization
        _check(0.0 < util <= 1.0, "CacheConfig.gpu_memory_utilization", "in (0, 1]", util)
        _check(self.swap_space >= 0.0, "CacheConfig.swap_space", "GiB >= 0", self.swap_space)
        _check(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 2,
            "CacheConfig.num_gpu_blocks_override", "None or an integer >= 2 (block 0 is the null block)",
            self.num_gpu_blocks_override,
        )


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # most requests in one step (running queue length)
    max_num_batched_tokens: int = 2048  # token budget of one step; bounds peak activation memory
    max_model_len: int | None = None  # prompt + output limit; None: the model's context length, filled in at startup
    swap_min_tokens: int = 0  # preempt by swap only for requests with at least this many computed tokens

    def __post_init__(self) -> None:
        _check(self.max_num_seqs >= 1, "SchedulerConfig.max_num_seqs", "an integer >= 1", self.max_num_seqs)
        _check(
            self.max_num_batched_tokens >= 1, "SchedulerConfig.max_num_batched_tokens", "an integer >= 1",
            self.max_num_batched_tokens,
        )
        _check(
            self.max_model_len is None or self.max_model_len >= 1, "SchedulerConfig.max_model_len",
            "None or an integer >= 1", self.max_model_len,
        )
        _check(self.swap_min_tokens >= 0, "SchedulerConfig.swap_min_tokens", "an integer >= 0", self.swap_min_tokens)


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str  # local path or hub id of the checkpoint
    device: str = "cpu"  # "cpu", "cuda" or "cuda:N"
    dtype: str = "auto"  # activation / KV dtype; "auto": the checkpoint's (fp32 on CPU)
    seed: int = 0  # seed for unseeded sampling
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        _check(bool(self.model), "EngineConfig.model", "a path or hub id", self.model)
        dev_ok = self.device in ("cpu", "cuda") or (self.device.startswith("cuda:") and self.device[5:].isdigit())
        _check(dev_ok, "EngineConfig.device", "'cpu', 'cuda' or 'cuda:N'", self.device)
        _check(self.dtype in DTYPES, "EngineConfig.dtype", f"one of {', '.join(DTYPES)}", self.dtype)
