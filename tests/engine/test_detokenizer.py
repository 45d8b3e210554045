"""Incremental detokenization (no broken UTF-8) and the output processor's stop strings and streaming."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from edgellm.engine.detokenizer import IncrementalDetokenizer
from edgellm.engine.output_processor import OutputProcessor
from edgellm.engine.request import FinishReason
from edgellm.engine.sampling_params import SamplingParams
from edgellm.engine.sched_output import EngineCoreOutput

TEXT = " héllo wörld 日本語 🎉 ok"


@pytest.fixture(scope="module")
def tokenizer(fixtures_dir):
    return AutoTokenizer.from_pretrained(fixtures_dir / "tiny-llama")


@pytest.mark.parametrize("use_decode_stream", [True, False], ids=["DecodeStream", "offsets"])
def test_split_multibyte_characters_never_emit_replacement(tokenizer, use_decode_stream):
    ids = tokenizer.encode(TEXT)
    # the byte-level vocabulary really splits these characters across tokens
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:"), use_decode_stream=use_decode_stream)
    pieces = [detok.add([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == TEXT
    # wherever the text so far ends inside a character, that token released nothing
    partial = [i for i in range(len(ids)) if tokenizer.decode(ids[: i + 1]).endswith("\ufffd")]
    assert len(partial) >= 6 and all(pieces[i] == "" for i in partial)


def feed(proc: OutputProcessor, rid: str, ids: list[int], last_finish: FinishReason | None = FinishReason.LENGTH):
    """One EngineCoreOutput per token; the last one carries `last_finish`."""
    results = []
    for i, t in enumerate(ids):
        finish = last_finish if i == len(ids) - 1 else None
        results.append(proc.process([EngineCoreOutput(rid, [t], finish, None, 0)]))
    return results


def test_stop_string_is_cut_and_aborts(tokenizer):
    proc = OutputProcessor(tokenizer)
    prompt = tokenizer.encode("Q:")
    text = " the answer is 42. STOP here and more"
    ids = tokenizer.encode(text)
    proc.add_request("a", "Q:", prompt, [SamplingParams(stop=["STOP", "never"])], stream=False)
    results = feed(proc, "a", ids, last_finish=None)
    finals = [o for r in results for o in r.request_outputs]
    assert len(finals) == 1 and finals[0].finished
    out = finals[0].outputs[0]
    assert out.text == " the answer is 42. "
    assert out.finish_reason == "stop" and out.stop_reason == "STOP"
    aborted = [rid for r in results for rid in r.reqs_to_abort]
    assert aborted == ["a"]
    assert not proc.states and not proc.parents  # forgotten once finished


def test_streaming_holds_back_a_possible_stop_prefix(tokenizer):
    proc = OutputProcessor(tokenizer)
    ids = tokenizer.encode(" one two END three")
    proc.add_request("s", None, tokenizer.encode("x"), [SamplingParams(stop=["END"])], stream=True)
    deltas = [o.outputs[0].text for r in feed(proc, "s", ids, last_finish=None) for o in r.request_outputs]
    streamed = "".join(deltas)
    assert streamed == " one two "
    assert "E" not in streamed and "EN" not in streamed


def test_streaming_deltas_add_up_and_finish_with_usage(tokenizer):
    proc = OutputProcessor(tokenizer)
    ids = tokenizer.encode(TEXT)
    prompt = tokenizer.encode("x y")
    proc.add_request("s", None, prompt, [SamplingParams()], stream=True)
    outs = [o for r in feed(proc, "s", ids) for o in r.request_outputs]
    assert "".join(o.outputs[0].text for o in outs) == TEXT
    assert [t for o in outs for t in o.outputs[0].token_ids] == ids
    assert [o.finished for o in outs] == [False] * (len(ids) - 1) + [True]
    last = outs[-1]
    assert last.outputs[0].finish_reason == "length"
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (
        len(prompt), len(ids), len(prompt) + len(ids))


def test_n_children_merge_into_one_output(tokenizer):
    proc = OutputProcessor(tokenizer)
    child_ids = proc.add_request("p", None, [1, 2], [SamplingParams(), SamplingParams()], stream=False)
    assert child_ids == ["0_p", "1_p"]
    a, b = tokenizer.encode(" alpha"), tokenizer.encode(" beta gamma")
    assert not proc.process([EngineCoreOutput("1_p", b, FinishReason.STOP, None, 0)]).request_outputs
    [out] = proc.process([EngineCoreOutput("0_p", a, FinishReason.LENGTH, None, 0)]).request_outputs
    assert out.request_id == "p" and out.finished
    assert [(c.index, c.text, c.finish_reason) for c in out.outputs] == [(0, " alpha", "length"), (1, " beta gamma", "stop")]
    assert out.usage.completion_tokens == len(a) + len(b)
