"""detect_quant_spec / parse_quant_config: aliases, lookup order and refusals (formats.md §0, §1.7, §2.4, §3.5)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgellm.loader.detect import detect_quant_spec, parse_quant_config
from edgellm.quant.spec import QuantMethod, QuantSpec

GPTQ_4_128 = QuantSpec(QuantMethod.GPTQ, bits=4, group_size=128, sym=True, act_order=False, format="gptq")
AWQ_4_128 = QuantSpec(QuantMethod.AWQ, bits=4, group_size=128, sym=False, act_order=False, format="gemm")


def _parse(d: dict) -> QuantSpec:
    return parse_quant_config(d, "config.json quantization_config.")


@pytest.mark.parametrize(
    "raw",
    [
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False},
        {"method": "gptq", "wbits": 4, "group_size": 128, "sym": True, "desc_act": False},
        {"QUANT_METHOD": "GPTQ", "W_BIT": 4, "Q_GROUP_SIZE": 128, "Sym": True, "desc_act": False},
        {"quant_method": "gptq", "method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "format": "gptq", "checkpoint_format": "gptq", "pack_dtype": "int32", "lm_head": False,
         "meta": {"static_groups": False, "damp_percent": 0.05}},
        {"bits": 4, "group_size": 128, "sym": True, "desc_act": False},  # old quantize_config.json, no method
    ],
)
def test_gptq_aliases(raw: dict) -> None:
    assert _parse(raw) == GPTQ_4_128


def test_gptq_v2_and_missing_defaults() -> None:
    spec = _parse({"quant_method": "gptq", "bits": 8, "group_size": -1, "checkpoint_format": "gptq_v2"})
    assert (spec.format, spec.sym, spec.act_order, spec.group_size) == ("gptq_v2", True, True, -1)


@pytest.mark.parametrize(
    "raw",
    [
        {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
        {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"},  # old quant_config.json
        {"method": "awq", "bits": 4, "group_size": 128, "format": "gemm", "checkpoint_format": "gemm", "version": "gemm",
         "zero_point": True, "desc_act": False, "lm_head": False, "pack_dtype": "int32"},
        {"quant_method": "awq", "bits": 4, "group_size": 128, "sym": False},
    ],
)
def test_awq_aliases(raw: dict) -> None:
    assert _parse(raw) == AWQ_4_128


def test_awq_modules_to_not_convert_become_ignore() -> None:
    spec = _parse({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": False, "modules_to_not_convert": ["lm_head"]})
    assert spec.sym and spec.ignore == ("lm_head",) and spec.group_size == 64


def _ct(weights: dict, **top) -> dict:
    group = {"targets": ["Linear"], "format": "pack-quantized", "input_activations": None, "output_activations": None,
             "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128,
                         "dynamic": False, **weights}}
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "sparsity_config": {}, "version": "0.19.0", **top}


@pytest.mark.parametrize(
    ("actorder", "expected"),
    [(None, False), ("weight", False), ("static", False), ("group", True), ("dynamic", True), (True, True)],
)
def test_compressed_tensors_actorder_strings(actorder: object, expected: bool) -> None:
    spec = _parse(_ct({"actorder": actorder}))
    assert spec.act_order is expected and spec.ignore == ("lm_head",) and spec.format == "pack-quantized"


def test_compressed_tensors_channel_strategy() -> None:
    assert _parse(_ct({"strategy": "channel", "group_size": None, "num_bits": 8, "symmetric": False})).group_size == -1
    assert _parse(_ct({"strategy": None, "group_size": -1})).group_size == -1


def test_compressed_tensors_two_groups_refused() -> None:
    raw = _ct({})
    raw["config_groups"]["group_1"] = {**raw["config_groups"]["group_0"], "targets": ["re:.*down_proj"]}
    with pytest.raises(ValueError, match=r"config_groups: expected exactly one group"):
        _parse(raw)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "activation": {"bits": 8}}, "activation"),
        ({"quant_method": "gptq", "bits": 4}, "group_size"),  # never guessed (T14)
        ({"quant_method": "gptq", "bits": 4, "group_size": 128, "format": "gptq", "checkpoint_format": "gptq_v2"}, "format: aliases disagree"),
        ({"quant_method": "gptq", "bits": 3, "group_size": 128, "format": "gptq_p"}, "format"),
        ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "sym": True, "zero_point": True}, "sym"),
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "backend": "llm-awq"}, "backend"),
        ({"group_size": 128}, "quant_method"),
    ],
)
def test_refused(raw: dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^config.json quantization_config.{field}"):
        _parse(raw)


def _write(model_dir: Path, name: str, data: dict) -> None:
    (model_dir / name).write_text(json.dumps(data))


def test_lookup_order_and_fallbacks(tmp_path: Path) -> None:
    _write(tmp_path, "config.json", {"architectures": ["LlamaForCausalLM"]})
    assert detect_quant_spec(tmp_path) is None
    _write(tmp_path, "quant_config.json", {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"})
    assert detect_quant_spec(tmp_path) == AWQ_4_128


def test_side_file_disagreeing_with_config_json(tmp_path: Path) -> None:
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False}
    _write(tmp_path, "config.json", {"quantization_config": gptq})
    _write(tmp_path, "quantize_config.json", {**gptq, "group_size": 64})
    with pytest.raises(ValueError, match="config.json quantization_config and quantize_config.json disagree on group_size: 128 vs 64"):
        detect_quant_spec(tmp_path)


def test_side_file_field_names_the_file(tmp_path: Path) -> None:
    _write(tmp_path, "config.json", {})
    _write(tmp_path, "quantize_config.json", {"quant_method": "gptq", "bits": 5, "group_size": 128})
    with pytest.raises(ValueError, match=r"^quantize_config.json bits: expected one of 2, 3, 4, 8, got 5$"):
        detect_quant_spec(tmp_path)


def test_every_quantized_fixture_is_detected(fixtures_dir: Path) -> None:
    for model_dir in sorted((fixtures_dir / "quantized").iterdir()):
        spec = detect_quant_spec(model_dir)
        assert spec is not None and spec.bits in (2, 3, 4, 8), model_dir.name
    assert detect_quant_spec(fixtures_dir / "tiny-llama") is None
