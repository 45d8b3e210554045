"""RequestOutput / CompletionOutput: what LLM.generate returns and AsyncLLM streams.

Field names are vLLM's (`vllm/outputs.py`). A streamed output is a delta (the text
and token ids produced since the previous one); `LLM.generate` returns each request
once, finished and cumulative.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class CompletionOutput:
    index: int  # which of the request's n samples
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop", "length" or "abort"; None while running
    logprobs: list[dict[int, float]] | None = None  # per token: {token id: logprob}, chosen token and top-N
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it


@dataclass(slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int  # summed over the n samples

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    usage: Usage | None = None  # set on the finished output
