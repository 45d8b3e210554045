"""Bad checkpoints fail with one line naming the file and the tensor or field.

Each case copies a fixture into tmp_path and breaks one thing.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from edgellm import load_model


def _copy(fixtures_dir: Path, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name.replace("/", "_")
    shutil.copytree(fixtures_dir / name, dst)
    return dst


def _edit_tensors(path: Path, edit) -> None:
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _load_error(model_dir: Path, exc: type[Exception] = ValueError) -> str:
    with pytest.raises(exc) as info:
        load_model(model_dir)
    message = str(info.value)
    assert "\n" not in message
    return message


@pytest.fixture
def llama(fixtures_dir: Path, tmp_path: Path) -> Path:
    return _copy(fixtures_dir, "tiny-llama", tmp_path)


@pytest.fixture
def gptq(fixtures_dir: Path, tmp_path: Path) -> Path:
    return _copy(fixtures_dir, "quantized/autogptq-w4-g128-asym-actorder", tmp_path)


GPTQ_FILE = "gptq_model-4bit-128g.safetensors"


# -- damaged files -------------------------------------------------------------------------


def test_truncated_safetensors(llama: Path) -> None:
    path = llama / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert "model.safetensors" in _load_error(llama)


def test_corrupt_header(llama: Path) -> None:
    path = llama / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:24] = b"not json at all!"
    path.write_bytes(bytes(data))
    assert "model.safetensors" in _load_error(llama)


def test_no_safetensors_file(llama: Path) -> None:
    (llama / "model.safetensors").unlink()
    (llama / "reference.safetensors").unlink()
    assert "no *.safetensors" in _load_error(llama, FileNotFoundError)


def test_missing_directory(tmp_path: Path) -> None:
    assert "nowhere" in _load_error(tmp_path / "nowhere", FileNotFoundError)


def test_sharded_index_names_a_missing_shard(fixtures_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(fixtures_dir, "quantized/autogptq-w4-g128-asym-sharded", tmp_path)
    (model_dir / "model-00003-of-00006.safetensors").unlink()
    message = _load_error(model_dir, FileNotFoundError)
    assert "model.safetensors.index.json" in message and "model-00003-of-00006.safetensors" in message


# -- tensors --------------------------------------------------------------------------------


def test_missing_tensor(llama: Path) -> None:
    _edit_tensors(llama / "model.safetensors", lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    message = _load_error(llama)
    assert "missing tensor model.layers.1.mlp.down_proj.weight" in message and "[256, 512]" in message


def test_missing_norm(llama: Path) -> None:
    _edit_tensors(llama / "model.safetensors", lambda t: t.pop("model.norm.weight"))
    assert "missing tensor model.norm.weight" in _load_error(llama)


def test_missing_untied_lm_head(llama: Path) -> None:
    _edit_tensors(llama / "model.safetensors", lambda t: t.pop("lm_head.weight"))
    assert "missing tensor lm_head.weight" in _load_error(llama)


def test_unexpected_tensor(llama: Path) -> None:
    _edit_tensors(llama / "model.safetensors", lambda t: t.update({"model.layers.0.mlp.extra.weight": torch.zeros(4)}))
    message = _load_error(llama)
    assert "model.safetensors" in message and "unexpected tensor model.layers.0.mlp.extra.weight" in message


def test_rotary_inv_freq_is_harmless(llama: Path) -> None:
    name = "model.layers.0.self_attn.rotary_emb.inv_freq"
    _edit_tensors(llama / "model.safetensors", lambda t: t.update({name: torch.ones(32)}))
    load_model(llama)


def test_wrong_shape(llama: Path) -> None:
    name = "model.layers.0.self_attn.q_proj.weight"
    _edit_tensors(llama / "model.safetensors", lambda t: t.update({name: t[name][:, :255].contiguous()}))
    message = _load_error(llama)
    assert f"model.safetensors: {name}: expected [256, 256] float, got [256, 255] F16" in message


def test_wrong_dtype(llama: Path) -> None:
    name = "model.layers.0.input_layernorm.weight"
    _edit_tensors(llama / "model.safetensors", lambda t: t.update({name: t[name].to(torch.int32)}))
    assert f"{name}: expected [256] float, got [256] I32" in _load_error(llama)


def test_nonzero_bias_on_a_bias_free_layer(gptq: Path) -> None:
    name = "model.layers.0.mlp.up_proj.bias"
    _edit_tensors(gptq / GPTQ_FILE, lambda t: t.update({name: torch.ones_like(t[name])}))
    message = _load_error(gptq)
    assert GPTQ_FILE in message and f"{name}: non-zero bias" in message


def test_quantized_tensor_with_wrong_shape(gptq: Path) -> None:
    name = "model.layers.1.self_attn.k_proj.scales"
    _edit_tensors(gptq / GPTQ_FILE, lambda t: t.update({name: t[name][:1].contiguous()}))
    message = _load_error(gptq)
    assert GPTQ_FILE in message and name in message and "[2, 128]" in message


def test_quantized_layer_missing_qzeros(gptq: Path) -> None:
    name = "model.layers.1.self_attn.k_proj.qzeros"
    _edit_tensors(gptq / GPTQ_FILE, lambda t: t.pop(name))
    message = _load_error(gptq)
    assert GPTQ_FILE in message and name in message


def test_bad_g_idx(gptq: Path) -> None:
    name = "model.layers.0.mlp.down_proj.g_idx"

    def break_g_idx(t: dict) -> None:
        g = t[name].clone()
        g[g == 1] = 0  # group 0 now has 256 rows, group 1 none
        t[name] = g

    _edit_tensors(gptq / GPTQ_FILE, break_g_idx)
    message = _load_error(gptq)
    assert GPTQ_FILE in message and name in message


def test_quantized_tensors_without_quantization_config(gptq: Path) -> None:
    _edit_json(gptq / "config.json", lambda c: c.pop("quantization_config"))
    (gptq / "quantize_config.json").unlink()
    message = _load_error(gptq)
    assert GPTQ_FILE in message and "no quantization_config" in message


def test_tied_lm_head_that_differs(fixtures_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(fixtures_dir, "arch/qwen2", tmp_path)
    _edit_tensors(
        model_dir / "model.safetensors",
        lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"] + 1}),
    )
    assert "lm_head.weight: differs from model.embed_tokens.weight" in _load_error(model_dir)


def test_tied_lm_head_stored_equal_is_accepted(fixtures_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(fixtures_dir, "arch/qwen2", tmp_path)
    _edit_tensors(model_dir / "model.safetensors", lambda t: t.update({"lm_head.weight": t["model.embed_tokens.weight"].clone()}))
    model = load_model(model_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_missing_qwen2_bias(fixtures_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(fixtures_dir, "arch/qwen2", tmp_path)
    _edit_tensors(model_dir / "model.safetensors", lambda t: t.pop("model.layers.0.self_attn.k_proj.bias"))
    assert "missing tensor model.layers.0.self_attn.k_proj.bias" in _load_error(model_dir)


# -- config ---------------------------------------------------------------------------------


def test_unknown_architecture(llama: Path) -> None:
    _edit_json(llama / "config.json", lambda c: c.update(architectures=["GPT2LMHeadModel"]))
    message = _load_error(llama)
    assert "config.json architectures: unsupported architecture 'GPT2LMHeadModel'" in message
    assert "LlamaForCausalLM" in message


def test_rope_spellings_disagree(llama: Path) -> None:
    _edit_json(llama / "config.json", lambda c: c.update(rope_theta=500000.0))
    assert "config.json rope_parameters" in _load_error(llama)


def test_unsupported_rope_type(llama: Path) -> None:
    _edit_json(llama / "config.json", lambda c: c["rope_parameters"].update(rope_type="yarn", factor=4.0))
    assert "rope_type" in _load_error(llama) and "'yarn'" in _load_error(llama)


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("quant_method", "bitsandbytes", "quant_method"),
        ("bits", 5, "bits"),
        ("group_size", 100, "group_size"),
        ("is_marlin_format", True, "is_marlin_format"),
        ("checkpoint_format", "marlin", "format"),
        ("dynamic", {"-:.*down_proj": {}}, "dynamic"),
        ("pack_dtype", "int16", "pack_dtype"),
        ("lm_head", True, "lm_head"),
    ],
)
def test_refused_gptq_config(gptq: Path, key: str, value: object, field: str) -> None:
    _edit_json(gptq / "config.json", lambda c: c["quantization_config"].update({key: value}))
    (gptq / "quantize_config.json").unlink()
    message = _load_error(gptq)
    found = json.dumps(value) if isinstance(value, bool) else repr(value)[:8]  # booleans read as in the file
    assert f"config.json quantization_config.{field}" in message and found in message


def test_config_files_disagree(gptq: Path) -> None:
    _edit_json(gptq / "quantize_config.json", lambda c: c.update(bits=8))
    message = _load_error(gptq)
    assert "config.json quantization_config and quantize_config.json disagree on bits" in message


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda q: q.update(format="naive-quantized") or q["config_groups"]["group_0"].pop("format"), "format"),
        (lambda q: q["config_groups"]["group_0"].update(input_activations={"num_bits": 8}), "input_activations"),
        (lambda q: q.update(sparsity_config={"format": "sparse-24-bitmask"}), "sparsity_config"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=2), "weights.num_bits"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="tensor"), "weights.strategy"),
        (lambda q: q["config_groups"]["group_0"]["weights"].update(actorder="sideways"), "weights.actorder"),
    ],
)
def test_refused_compressed_tensors_config(fixtures_dir: Path, tmp_path: Path, edit, field: str) -> None:
    model_dir = _copy(fixtures_dir, "quantized/ct-w4a16-g128-sym", tmp_path)
    _edit_json(model_dir / "config.json", lambda c: edit(c["quantization_config"]))
    message = _load_error(model_dir)
    assert "config.json quantization_config" in message and field in message


def test_refused_awq_gemv_fast(fixtures_dir: Path, tmp_path: Path) -> None:
    model_dir = _copy(fixtures_dir, "quantized/autoawq-gemm-w4-g128", tmp_path)
    _edit_json(model_dir / "config.json", lambda c: c["quantization_config"].update(version="gemv_fast"))
    assert "config.json quantization_config.version" in _load_error(model_dir)
