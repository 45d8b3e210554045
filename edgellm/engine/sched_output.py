"""The records crossing scheduler -> runner -> scheduler -> output processor.

One step:

    Scheduler.schedule() --SchedulerOutput--> runner.execute() --RunnerOutput-->
    Scheduler.update_from_output() --list[EngineCoreOutput]--> output processor

SchedulerOutput is diff-only (vLLM `v1/core/sched/output.py`): a request's
prompt, sampling params and block table travel once, in NewRequestData; later
steps send only the blocks appended and the counts. The runner therefore keeps
per-request state (token ids, block-table row) from first sight until the
request id shows up in `finished_req_ids`, and appends its own sampled token to
that state by the scheduler's rule: only when `num_computed_tokens +
num_scheduled_tokens == its number of tokens` (a partial-prefill sample is dropped).

Order the runner must keep inside `execute` (design §4.7):
    1. blocks_to_swap_out copies   (device -> CPU)
    2. blocks_to_swap_in copies    (CPU -> device)
    3. the forward
all on one stream. A block freed by this step's swap-out may already be handed
to another request in this very step; it is safe because the copy out is
enqueued before the forward that overwrites it.
Pure Python: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from edgellm.engine.request import FinishReason
from edgellm.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class NewRequestData:
    """A request the runner has not seen (or dropped): everything it needs, once."""

    req_id: str
    prompt_token_ids: list[int]  # the prompt; output tokens are appended by the runner as it samples them
    sampling_params: SamplingParams  # the runner builds its sampling tensors from these
    block_ids: list[int]  # the whole block table row, including prefix-cache hits
    num_computed_tokens: int  # tokens already in the cache before this step (the prefix hit); positions start here


@dataclass(slots=True)
class CachedRequestData:
    """Requests the runner already holds, as parallel lists (one column per request)."""

    req_ids: list[str] = field(default_factory=list)
    # resumed=False: blocks appended to the row this step. resumed=True: the whole new row (replaces the old one).
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)  # tokens in the cache before this step
    # True when the request comes back from preemption (swap-in or recompute): its block ids all changed.
    resumed: list[bool] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)


@dataclass(slots=True)
class SchedulerOutput:
    """What to compute this step: requests, token counts, block moves."""

    new_reqs: list[NewRequestData] = field(default_factory=list)  # first time scheduled: full state
    cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)  # seen before: diffs only
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)  # req_id -> tokens to compute this step
    total_num_scheduled_tokens: int = 0  # sum of the above; the flat batch length T
    # Finished or aborted since the last step: the runner drops their cached state.
    finished_req_ids: set[str] = field(default_factory=set)
    # Preempted this step (swap or recompute): the runner removes them from the batch but keeps their token ids.
    preempted_req_ids: set[str] = field(default_factory=set)
    # (gpu_block, cpu_block) copies to run BEFORE the forward; the gpu blocks may be reused by this step's tokens.
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    # (cpu_block, gpu_block) copies to run before the forward, after the swap-outs.
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)


@dataclass(slots=True)
class TokenLogprobs:
    """Log-probabilities around one sampled token."""

    token_ids: list[int]  # the chosen token first, then the top-N by probability
    logprobs: list[float]  # matching log-probabilities (of the processed distribution)


@dataclass(slots=True)
class RunnerOutput:
    """What the runner computed: one sample per scheduled request (dropped by the scheduler on partial prefill)."""

    req_ids: list[str]  # the scheduled requests, in batch order
    sampled_token_ids: list[list[int]]  # parallel to req_ids; one token each today
    # Parallel to req_ids: per request one TokenLogprobs per sampled token, or None when it did not ask;
    # the whole field is None when no request in the batch asked.
    logprobs: list[list[TokenLogprobs] | None] | None = None


@dataclass(slots=True)
class EngineCoreOutput:
    """One request's news from one step, for the output processor (text, stop strings, streaming)."""

    request_id: str
    new_token_ids: list[int]  # tokens accepted this step (empty for an abort)
    finish_reason: FinishReason | None  # set on the request's last output
    new_logprobs: list[TokenLogprobs] | None  # parallel to new_token_ids when the request asked for logprobs
    num_cached_tokens: int  # prompt tokens served from the prefix cache (usage reporting)
    stop_reason: int | None = None  # the stop token id that finished it (None for EOS, length or abort)
