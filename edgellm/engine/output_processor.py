"""OutputProcessor: token news from the scheduler -> text, stop strings, RequestOutputs.

Text lives here, not in the scheduler (vLLM `v1/engine/output_processor.py`). Per
request it keeps an IncrementalDetokenizer, the text so far and what was already
sent. Stop strings are matched on the text and cut from it; a hit finishes the
request here and is handed back to the engine, which aborts it in the scheduler.
While streaming, the last max(len(stop)) − 1 characters are held back: they may be
the start of a stop string that the next token completes.

A request with n > 1 runs as n child requests ("0_<id>", "1_<id>", ...); outputs carry
the parent id and the child's index, and the request is `finished` when its last
child is. Streaming emits one delta per child per step; otherwise one cumulative
RequestOutput with all n completions comes when the last child finishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgellm.engine.detokenizer import IncrementalDetokenizer
from edgellm.engine.request import FinishReason
from edgellm.engine.sampling_params import SamplingParams
from edgellm.engine.sched_output import EngineCoreOutput
from edgellm.outputs import CompletionOutput, RequestOutput, Usage


@dataclass(slots=True)
class ParentState:
    """The user's request: its n children and their finished completions."""

    child_ids: list[str]
    num_unfinished: int
    completions: list[CompletionOutput | None]  # by index, kept for the cumulative output
    num_completion_tokens: int = 0
    num_cached_tokens: int = 0


@dataclass(slots=True)
class RequestState:
    request_id: str  # the parent's id: what the caller sees
    index: int  # which of the parent's n samples
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    stream: bool  # deltas every step, or one cumulative output when finished
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] | None = None
    num_sent_chars: int = 0
    num_sent_tokens: int = 0

    @property
    def hold_back(self) -> int:
        return max((len(s) for s in self.params.stop), default=1) - 1


@dataclass(slots=True)
class ProcessedOutputs:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]  # finished here by a stop string; the scheduler must drop them


class OutputProcessor:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.states: dict[str, RequestState] = {}  # by child id
        self.parents: dict[str, ParentState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: list[SamplingParams], stream: bool) -> list[str]:
        """Track a request with one SamplingParams per child (n of them); returns the child ids."""
        if request_id in self.parents:
            raise ValueError(f"request_id: {request_id!r} is already in use")
        child_ids = [request_id] if len(params) == 1 else [f"{i}_{request_id}" for i in range(len(params))]
        self.parents[request_id] = ParentState(child_ids, len(params), [None] * len(params))
        for i, (child_id, p) in enumerate(zip(child_ids, params)):
            detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids)
            self.states[child_id] = RequestState(request_id, i, prompt, prompt_token_ids, p, detok, stream,
                                                 logprobs=[] if p.logprobs is not None else None)
        return child_ids

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget parents; returns their unfinished child ids (for the scheduler)."""
        children = []
        for rid in request_ids:
            parent = self.parents.pop(rid, None)
            if parent is not None:
                children += [c for c in parent.child_ids if self.states.pop(c, None) is not None]
        return children

    def process(self, core_outputs: list[EngineCoreOutput]) -> ProcessedOutputs:
        result = ProcessedOutputs([], [])
        for co in core_outputs:
            st = self.states.get(co.request_id)
            if st is None:  # already finished here (stop string) or aborted by the caller
                continue
            finish = co.finish_reason.value if co.finish_reason is not None else None
            stop_reason: int | str | None = co.stop_reason
            st.token_ids.extend(co.new_token_ids)
            if st.logprobs is not None and co.new_logprobs:
                st.logprobs.extend(dict(zip(lp.token_ids, lp.logprobs)) for lp in co.new_logprobs)
            old_len = len(st.text)
            st.text += st.detokenizer.add(co.new_token_ids)
            if finish is None or finish == FinishReason.LENGTH.value:
                hit = self._find_stop(st, old_len)
                if hit is not None:
                    st.text = st.text[: hit[0]]
                    finish, stop_reason = FinishReason.STOP.value, hit[1]
                    if co.finish_reason is None:
                        result.reqs_to_abort.append(co.request_id)
            out = self._make_output(st, co.num_cached_tokens, finish, stop_reason)
            if out is not None:
                result.request_outputs.append(out)
            if finish is not None:
                del self.states[co.request_id]
                if self.parents[st.request_id].num_unfinished == 0:
                    del self.parents[st.request_id]
        return result

    @staticmethod
    def _find_stop(st: RequestState, old_len: int) -> tuple[int, str] | None:
        """Earliest stop string that ends in the new text: (where it starts, which)."""
        if not st.params.stop or len(st.token_ids) < st.params.min_tokens:
            return None
        best: tuple[int, str] | None = None
        for s in st.params.stop:
            i = st.text.find(s, max(0, old_len - len(s) + 1))
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def _make_output(self, st: RequestState, num_cached: int, finish: str | None,
                     stop_reason: int | str | None) -> RequestOutput | None:
        parent = self.parents[st.request_id]
        parent.num_cached_tokens = max(parent.num_cached_tokens, num_cached)
        finished = finish is not None
        if finished:
            parent.num_unfinished -= 1
            parent.num_completion_tokens += len(st.token_ids)
            parent.completions[st.index] = CompletionOutput(
                st.index, st.text, st.token_ids, finish, st.logprobs, stop_reason
            )
        all_done = parent.num_unfinished == 0
        usage = Usage(len(st.prompt_token_ids), parent.num_completion_tokens) if all_done else None
        if st.stream:
            upto = len(st.text) if finished else max(st.num_sent_chars, len(st.text) - st.hold_back)
            delta = CompletionOutput(
                st.index, st.text[st.num_sent_chars : upto], st.token_ids[st.num_sent_tokens :], finish,
                st.logprobs[st.num_sent_tokens :] if st.logprobs is not None else None,
                stop_reason if finished else None,
            )
            st.num_sent_chars, st.num_sent_tokens = upto, len(st.token_ids)
            outputs = [delta]
        elif all_done:
            outputs = list(parent.completions)
        else:
            return None
        return RequestOutput(st.request_id, st.prompt, st.prompt_token_ids, outputs, all_done,
                             parent.num_cached_tokens, usage)
