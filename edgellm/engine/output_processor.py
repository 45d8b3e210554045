"""OutputProcessor: token news from the scheduler -> text, stop strings, RequestOutputs.

Text lives here, not in the scheduler (vLLM `v1/engine/output_processor.py`). Per
request it keeps an IncrementalDetokenizer, the text so far and what was already
sent. Stop strings are matched on the text and cut from it; a hit finishes the
request here and is handed back to the engine, which aborts it in the scheduler.
While streaming, the last max(len(stop)) − 1 characters are held back: they may be
the start of a stop string that the next token completes.
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
class RequestState:
    request_id: str
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
        self.states: dict[str, RequestState] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, stream: bool) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids)
        self.states[request_id] = RequestState(request_id, prompt, prompt_token_ids, params, detok, stream,
                                               logprobs=[] if params.logprobs is not None else None)

    def abort_requests(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            self.states.pop(rid, None)

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
        finished = finish is not None
        if not st.stream and not finished:
            return None
        if st.stream:
            upto = len(st.text) if finished else max(st.num_sent_chars, len(st.text) - st.hold_back)
            text = st.text[st.num_sent_chars : upto]
            token_ids = st.token_ids[st.num_sent_tokens :]
            logprobs = st.logprobs[st.num_sent_tokens :] if st.logprobs is not None else None
            st.num_sent_chars, st.num_sent_tokens = upto, len(st.token_ids)
        else:
            text, token_ids, logprobs = st.text, st.token_ids, st.logprobs
        usage = Usage(len(st.prompt_token_ids), len(st.token_ids)) if finished else None
        completion = CompletionOutput(0, text, token_ids, finish, logprobs, stop_reason if finished else None)
        return RequestOutput(st.request_id, st.prompt, st.prompt_token_ids, [completion], finished,
                             max(num_cached, 0), usage)
