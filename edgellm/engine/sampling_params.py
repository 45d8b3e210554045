"""SamplingParams: how one request turns logits into tokens and when it stops.

Names and meanings follow vLLM's SamplingParams. Invalid values raise ValueError
naming the field and the allowed range.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 -> greedy
    top_p: float = 1.0  # (0, 1]
    top_k: int = 0  # 0 or -1: off
    min_p: float = 0.0  # [0, 1]
    presence_penalty: float = 0.0  # [-2, 2]
    frequency_penalty: float = 0.0  # [-2, 2]
    repetition_penalty: float = 1.0  # > 0; 1 is off
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] = field(default_factory=list)  # stop strings, not included in the output
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None  # top-N logprobs per output token (plus the chosen token's)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self._check(self.n >= 1, "n", "an integer >= 1", self.n)
        self._check(self.temperature >= 0.0, "temperature", "a number >= 0", self.temperature)
        self._check(0.0 < self.top_p <= 1.0, "top_p", "in (0, 1]", self.top_p)
        self._check(self.top_k == -1 or self.top_k >= 0, "top_k", "-1, 0 (off) or a positive integer", self.top_k)
        self._check(0.0 <= self.min_p <= 1.0, "min_p", "in [0, 1]", self.min_p)
        self._check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "in [-2, 2]", self.presence_penalty)
        self._check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "in [-2, 2]", self.frequency_penalty)
        self._check(self.repetition_penalty > 0.0, "repetition_penalty", "a number > 0", self.repetition_penalty)
        self._check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "an integer >= 1", self.max_tokens)
        self._check(self.min_tokens >= 0, "min_tokens", "an integer >= 0", self.min_tokens)
        if self.max_tokens is not None:
            self._check(self.min_tokens <= self.max_tokens, "min_tokens", f"<= max_tokens ({self.max_tokens})", self.min_tokens)
        self._check(self.logprobs is None or self.logprobs >= 0, "logprobs", "an integer >= 0", self.logprobs)
        self._check(all(s for s in self.stop), "stop", "non-empty strings", self.stop)

    @staticmethod
    def _check(ok: bool, name: str, allowed: str, value: object) -> None:
        if not ok:
            raise ValueError(f"SamplingParams.{name}: expected {allowed}, got {value!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
