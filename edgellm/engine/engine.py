"""LLMEngine: add_request / step / abort_request, the core that LLM and AsyncLLM drive.

Startup, in order: tokenizer -> model (edgellm.load_model) -> KV pool sizes ->
KV tensors (device pool + CPU swap pool) -> runner -> scheduler. One step is
vLLM V1's `EngineCore.step` (design §2): schedule, execute, update; the output
processor then turns token news into text and RequestOutputs, and a stop-string
hit is sent back to the scheduler as a finish.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

import psutil
import torch
from transformers import AutoTokenizer

from edgellm.config import CacheConfig, EngineConfig, SchedulerConfig
from edgellm.engine.cpu_runner import CpuModelRunner
from edgellm.engine.kv_cache import GIB, KVCache, num_swap_blocks
from edgellm.engine.output_processor import OutputProcessor
from edgellm.engine.request import Request, RequestStatus
from edgellm.engine.sampling_params import SamplingParams
from edgellm.engine.scheduler import Scheduler
from edgellm.loader.load import load_model
from edgellm.outputs import RequestOutput

logger = logging.getLogger(__name__)

# The CPU backend's KV pool when no block count is forced: at most this share of the available
# RAM and this many GiB (vLLM's CPU backend defaults to 4 GiB); the pool is zero-filled, so it is paid for.
CPU_KV_RAM_FRACTION = 0.25
CPU_KV_MAX_GIB = 2.0
LOG_INTERVAL_S = 10.0  # the periodic throughput line
SEED_STRIDE = 0x9E3779B97F4A7C15  # golden-ratio stride: child seeds of one request stay far apart
TORCH_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def engine_config_from_args(
    model: str,
    device: str = "cpu",
    dtype: str = "auto",
    *,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    swap_space: float = 4.0,
    max_num_seqs: int = 64,
    max_num_batched_tokens: int = 2048,
    max_model_len: int | None = None,
    enable_prefix_caching: bool = True,
    num_gpu_blocks_override: int | None = None,
    seed: int = 0,
) -> EngineConfig:
    """EngineConfig from vLLM's flat engine-argument names (LLM, AsyncLLM, the CLI)."""
    cache = CacheConfig(block_size, gpu_memory_utilization, swap_space, enable_prefix_caching, num_gpu_blocks_override)
    sched = SchedulerConfig(max_num_seqs, max_num_batched_tokens, max_model_len)
    return EngineConfig(model=model, device=device, dtype=dtype, seed=seed, cache=cache, scheduler=sched)


def child_sampling_params(params: SamplingParams) -> list[SamplingParams]:
    """n > 1 -> n single-sample params; seeded requests give child i a seed derived from (seed, i)."""
    if params.n == 1:
        return [params]
    children = []
    for i in range(params.n):
        seed = None if params.seed is None else (params.seed + i * SEED_STRIDE) % 2**63
        children.append(dataclasses.replace(params, n=1, seed=seed))
    return children


class LLMEngine:
    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        model_dir = _resolve_model(config.model)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        dtype = _torch_dtype(config)
        self.model = load_model(model_dir, config.device, dtype)
        mc = self.model.config
        if config.device != "cpu":
            logger.info("device %s: the CpuModelRunner's reference kernels run there (no GPU runner yet)", config.device)
        # Paged attention has no sliding window: a windowed model (Mistral) is held inside its window.
        limit, limit_name = mc.max_position_embeddings, "max_position_embeddings"
        if mc.sliding_window is not None and mc.sliding_window < limit:
            limit, limit_name = mc.sliding_window, "sliding_window (windowed attention is not implemented)"
        self.max_model_len = config.scheduler.max_model_len or limit
        if self.max_model_len > limit:
            raise ValueError(f"max_model_len: expected <= the model's {limit_name} {limit}, got {self.max_model_len}")
        self.eos_token_id, self.extra_stop_ids = _eos_ids(model_dir, self.tokenizer)

        kv, swap = self._allocate_kv_caches(dtype)
        self.runner = CpuModelRunner(self.model, kv, swap, config.cache.block_size, config.seed, self.eos_token_id)
        sched_config = dataclasses.replace(config.scheduler, max_model_len=self.max_model_len)
        num_cpu_blocks = swap.num_blocks if config.cache.swap_space > 0 else 0
        self.scheduler = Scheduler(sched_config, config.cache, kv.num_blocks, num_cpu_blocks)
        self.output_processor = OutputProcessor(self.tokenizer)
        self._last_log_time = time.monotonic()
        self._num_logged_tokens = 0

    def _allocate_kv_caches(self, dtype: torch.dtype) -> tuple[KVCache, KVCache]:
        """The device pool (zero-filled) and the CPU swap pool, sized and logged."""
        mc, cache = self.model.config, self.config.cache
        bs = cache.block_size
        block_bytes = KVCache.block_bytes(mc.num_layers, bs, mc.num_kv_heads, mc.head_dim, dtype)
        num_blocks = self._num_device_blocks(block_bytes)
        # 0 blocks: swap off; the scheduler is told 0, the runner still gets a one-block pool to hold
        num_cpu_blocks = num_swap_blocks(cache.swap_space, block_bytes)
        kv = KVCache(mc.num_layers, num_blocks, bs, mc.num_kv_heads, mc.head_dim, dtype, self.config.device, zero=True)
        swap = KVCache(mc.num_layers, max(num_cpu_blocks, 1), bs, mc.num_kv_heads, mc.head_dim, dtype, "cpu",
                       zero=False, pin_memory=self.config.device != "cpu")
        logger.info(
            "KV cache: %d blocks of %d tokens (%d tokens, %.2f GiB) on %s; swap pool %d blocks (%.2f GiB)",
            num_blocks - 1, bs, (num_blocks - 1) * bs, num_blocks * block_bytes / GIB, self.config.device,
            max(num_cpu_blocks - 1, 0), num_cpu_blocks * block_bytes / GIB,
        )
        return kv, swap

    def _num_device_blocks(self, block_bytes: int) -> int:
        """The forced count, else enough for max_num_seqs full-length requests within the memory budget."""
        cache, sched = self.config.cache, self.config.scheduler
        if cache.num_gpu_blocks_override is not None:
            return cache.num_gpu_blocks_override
        blocks_per_seq = -(-self.max_model_len // cache.block_size)
        wanted = sched.max_num_seqs * blocks_per_seq + 1
        if self.config.device == "cpu":
            budget = int(min(psutil.virtual_memory().available * CPU_KV_RAM_FRACTION, CPU_KV_MAX_GIB * GIB))
        else:
            free, total = torch.cuda.mem_get_info(torch.device(self.config.device))
            budget = int(free - total * (1 - cache.gpu_memory_utilization))
        return max(2, min(wanted, budget // block_bytes))

    def add_request(self, request_id: str, prompt: str | list[int], params: SamplingParams | None = None,
                    stream: bool = False, add_special_tokens: bool = True) -> None:
        """Queue a request: a text prompt (tokenized here) or its token ids. n > 1 fans out into n requests
        that share the prompt's cached blocks."""
        params = params or SamplingParams()
        if isinstance(prompt, str):
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        else:
            text, ids = None, list(prompt)
        if not ids:
            raise ValueError(f"prompt: expected at least one token, got none (request {request_id})")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"prompt: {len(ids)} tokens > max_model_len {self.max_model_len}; shorten it or raise max_model_len"
            )
        if self.extra_stop_ids and not params.ignore_eos:
            params = dataclasses.replace(params, stop_token_ids=params.stop_token_ids + self.extra_stop_ids)
        children = child_sampling_params(params)
        child_ids = self.output_processor.add_request(request_id, text, ids, children, stream)
        for child_id, p in zip(child_ids, children):
            self.scheduler.add_request(Request(child_id, ids, p, self.eos_token_id, self.config.cache.block_size))

    def abort_request(self, request_ids: str | list[str]) -> None:
        """Drop requests (by the caller's id); their blocks are freed at once."""
        ids = [request_ids] if isinstance(request_ids, str) else list(request_ids)
        self.scheduler.finish_requests(self.output_processor.abort_requests(ids), RequestStatus.FINISHED_ABORTED)

    def step(self) -> list[RequestOutput]:
        sched_out = self.scheduler.schedule()
        runner_out = self.runner.execute(sched_out)
        core_outputs = self.scheduler.update_from_output(sched_out, runner_out)

        processed = self.output_processor.process(core_outputs)
        self.scheduler.finish_requests(processed.reqs_to_abort, RequestStatus.FINISHED_STOPPED)
        self._log_stats(sum(len(o.new_token_ids) for o in core_outputs))
        return processed.request_outputs

    def _log_stats(self, num_new_tokens: int) -> None:
        """One INFO line every LOG_INTERVAL_S seconds: queues, generation speed, KV use."""
        self._num_logged_tokens += num_new_tokens
        now = time.monotonic()
        if now - self._last_log_time < LOG_INTERVAL_S:
            return
        s = self.scheduler
        logger.info(
            "running %d, swapped %d, waiting %d; %.1f generated tok/s; KV %.0f%%, swap pool %.0f%%",
            len(s.running), len(s.swapped), len(s.waiting), self._num_logged_tokens / (now - self._last_log_time),
            100 * s.kv_cache_manager.usage, 100 * s.kv_cache_manager.cpu_usage,
        )
        self._last_log_time, self._num_logged_tokens = now, 0

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()


def _resolve_model(model: str) -> Path:
    """A checkpoint directory as is; else a pulled name or a cached hub id (edgellm.hub, imported only
    then: it brings the GGUF reader along)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from edgellm.hub.pull import resolve_model

    return resolve_model(model)


def _torch_dtype(config: EngineConfig) -> torch.dtype:
    if config.dtype != "auto":
        return TORCH_DTYPES[config.dtype]
    # "auto": fp32 on the CPU (fp16 matmuls are slow there and the fixtures' tolerances assume fp32)
    return torch.float32 if config.device == "cpu" else torch.float16


def _eos_ids(model_dir: Path, tokenizer) -> tuple[int | None, list[int]]:
    """The tokenizer's EOS, plus any further EOS ids generation_config.json lists (as stop token ids)."""
    eos = tokenizer.eos_token_id
    extra: list[int] = []
    gen_path = model_dir / "generation_config.json"
    if gen_path.is_file():
        gen_eos = json.loads(gen_path.read_text()).get("eos_token_id")
        ids = gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
        if eos is None and ids:
            eos = ids[0]
        extra = [i for i in ids if i != eos]
    return eos, extra
