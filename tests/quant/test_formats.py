"""Format converters against the producers' own checkpoints (shared/fixtures/quantized/*).

Each quantized Linear of every fixture is converted, dequantized with the reference op,
un-permuted, transposed and compared with the fp16 base model's weight. The error is
measured in units of the element's own scale step: a correct decode lands at ~0.25-0.42
mean |err|/s with no bias, a missing or extra zero offset at ~1.0 (bias ~1.0), a wrong
act-order permutation at ~3.3, a wrong AWQ interleave at ~0.65-2.5 (numbers measured on
these fixtures when the bounds were chosen; `test_bounds_catch_*` keep them honest).
"""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

from edgellm.kernels.qweight import QuantizedWeight
from edgellm.kernels.reference import dequantize, pack_codes, quant_matmul_ref, unpack_codes
from edgellm.quant.formats import awq, compressed_tensors, gptq
from edgellm.quant.spec import QuantMethod, QuantSpec
from fixture_paths import fixtures_root

MAX_MEAN_ABS_STEPS = 0.5  # mean |err| / s over a layer
MAX_MEAN_BIAS_STEPS = 0.1  # |mean err / s| over a layer
MAX_REL_ERR = {2: 1.0, 3: 0.45, 4: 0.25, 8: 0.015}  # ||err|| / ||W|| (GPTQ and compressed-tensors)
QUANTIZED = sorted(p.name for p in (fixtures_root() / "quantized").glob("*") if p.is_dir())  # for parametrize


def test_every_fixture_is_collected(fixtures_dir: Path) -> None:
    assert QUANTIZED == sorted(p.name for p in _root(fixtures_dir).iterdir() if p.is_dir()) and len(QUANTIZED) >= 22


def _root(fixtures_dir: Path) -> Path:
    return fixtures_dir / "quantized"


@lru_cache(maxsize=None)
def _tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of a checkpoint folder (all shards), reference logits excluded."""
    out: dict[str, Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        if file.name != "reference.safetensors":
            out.update(load_file(file))
    return out


def _spec(folder: Path) -> QuantSpec:
    """A test-only reading of config.json's quantization_config (the loader has the real one)."""
    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    method = QuantMethod(qc["quant_method"])
    if method == QuantMethod.COMPRESSED_TENSORS:
        w = qc["config_groups"]["group_0"]["weights"]
        act_order = w["actorder"] in ("group", "dynamic", True)
        return QuantSpec(method, w["num_bits"], w["group_size"], w["symmetric"], act_order, qc["format"])
    if method == QuantMethod.AWQ:
        return QuantSpec(method, qc["bits"], qc["group_size"], not qc["zero_point"], False, qc["version"])
    return QuantSpec(method, qc["bits"], qc["group_size"], qc["sym"], qc["desc_act"], qc.get("format", "gptq"))


def _converter(spec: QuantSpec) -> ModuleType:
    return {QuantMethod.GPTQ: gptq, QuantMethod.AWQ: awq, QuantMethod.COMPRESSED_TENSORS: compressed_tensors}[spec.method]


def _base_dir(fixtures_dir: Path, folder: Path) -> Path:
    info = json.loads((folder / "fixture.json").read_text())
    # GPTQ fixtures name it `base_model`, GPTQModel/compressed-tensors `base`; AutoAWQ's say so in `calibration`.
    where = info.get("base_model") or info.get("base") or info["calibration"]
    return fixtures_dir / ("tiny-llama-odd" if "tiny-llama-odd" in where else "tiny-llama")


def _linears(fixtures_dir: Path, name: str) -> list[tuple[str, dict[str, Tensor], Tensor]]:
    """(prefix, {suffix: tensor}, base fp16 weight [N, K]) for every quantized Linear of a fixture."""
    folder = _root(fixtures_dir) / name
    tensors = _tensors(folder)
    base = _tensors(_base_dir(fixtures_dir, folder))
    marker = ".weight_packed" if "weight_packed" in " ".join(tensors) else ".qweight"
    prefixes = sorted(k.removesuffix(marker) for k in tensors if k.endswith(marker))
    out = []
    for prefix in prefixes:
        parts = {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.rsplit(".", 1)[0] == prefix}
        out.append((prefix, parts, base[prefix + ".weight"]))
    assert len(out) == 14, f"{name}: expected 14 quantized Linears (2 layers x 7), found {len(out)}"
    return out


def _convert(spec: QuantSpec, prefix: str, parts: dict[str, Tensor], weight: Tensor) -> QuantizedWeight:
    N, K = weight.shape
    return _converter(spec).to_internal(parts, spec, prefix, K, N)


@lru_cache(maxsize=None)
def _converted(fixtures_dir: Path, name: str) -> list[tuple[str, dict[str, Tensor], Tensor, QuantizedWeight]]:
    """`_linears` plus each Linear's QuantizedWeight, converted once per session."""
    spec = _spec(_root(fixtures_dir) / name)
    return [(p, parts, w, _convert(spec, p, parts, w)) for p, parts, w in _linears(fixtures_dir, name)]


def _dense_hf(qw: QuantizedWeight) -> Tensor:
    """Dequantized weight in HF orientation [N, K], natural input order (perm undone)."""
    w = dequantize(qw)  # [K, N], sorted rows
    if qw.perm is not None:
        natural = torch.empty_like(w)
        natural[qw.perm.long()] = w
        w = natural
    return w.T


def _steps(qw: QuantizedWeight) -> Tensor:
    """Scale step of every element, [N, K] natural order."""
    group = torch.arange(qw.in_features) // qw.group_size
    s = qw.scales.float()[group]  # [K, N] sorted rows
    if qw.perm is not None:
        natural = torch.empty_like(s)
        natural[qw.perm.long()] = s
        s = natural
    return s.T


def _unfold_awq(wq: Tensor, w: Tensor) -> Tensor:
    """Best diag(r) @ w @ diag(c) ~ wq: AWQ folds per-input scales into columns (and up_proj's rows)."""
    r, c = torch.ones(w.shape[0]), torch.ones(w.shape[1])
    for _ in range(3):
        m = r[:, None] * w
        c = (wq * m).sum(0) / (m * m).sum(0)
        m = w * c
        r = (wq * m).sum(1) / (m * m).sum(1)
    return r[:, None] * w * c


def _error_steps(qw: QuantizedWeight, weight: Tensor, awq_folded: bool) -> tuple[float, float, float]:
    """(mean |err|/s, mean err/s, ||err||/||W||) of qw against the base weight."""
    wq, w = _dense_hf(qw), weight.float()
    if awq_folded:
        w = _unfold_awq(wq, w)
    err = wq - w
    s = _steps(qw)
    return float((err.abs() / s).mean()), float((err / s).mean()), float(err.norm() / w.norm())


def _assert_qw_equal(a: QuantizedWeight, b: QuantizedWeight) -> None:
    assert (a.bits, a.group_size, a.in_features) == (b.bits, b.group_size, b.in_features)
    assert torch.equal(a.qweight, b.qweight)
    assert a.scales.dtype == b.scales.dtype and torch.equal(a.scales, b.scales)
    assert (a.zeros is None) == (b.zeros is None)
    if a.zeros is not None:
        assert a.zeros.dtype == b.zeros.dtype and torch.equal(a.zeros, b.zeros)
    assert (a.perm is None) == (b.perm is None)
    if a.perm is not None:
        assert torch.equal(a.perm, b.perm)


@pytest.mark.parametrize("name", QUANTIZED)
def test_fixture_matches_base_weights(fixtures_dir: Path, name: str) -> None:
    spec = _spec(_root(fixtures_dir) / name)
    for prefix, parts, weight, qw in _converted(fixtures_dir, name):
        assert qw.scales.dtype == parts.get("scales", parts.get("weight_scale")).dtype  # never converted
        mean_abs, bias, rel = _error_steps(qw, weight, awq_folded=spec.method == QuantMethod.AWQ)
        assert mean_abs < MAX_MEAN_ABS_STEPS, f"{name} {prefix}: mean |err| = {mean_abs:.3f} scale steps"
        assert abs(bias) < MAX_MEAN_BIAS_STEPS, f"{name} {prefix}: mean err = {bias:.3f} scale steps"
        if spec.method != QuantMethod.AWQ:
            assert rel < MAX_REL_ERR[spec.bits], f"{name} {prefix}: relative error {rel:.4f}"


@pytest.mark.parametrize("name", QUANTIZED)
def test_fixture_round_trips_bit_exact(fixtures_dir: Path, name: str) -> None:
    spec = _spec(_root(fixtures_dir) / name)
    conv = _converter(spec)
    for prefix, parts, weight, qw in _converted(fixtures_dir, name):
        parts = {k: v for k, v in parts.items() if k != "bias"}
        back = conv.from_internal(qw, spec)
        assert sorted(back) == sorted(parts), prefix
        for key, t in parts.items():
            assert back[key].dtype == t.dtype and torch.equal(back[key], t), f"{prefix}.{key}"
        _assert_qw_equal(_convert(spec, prefix, back, weight), qw)


def test_fixture_conversion_is_as_expected(fixtures_dir: Path) -> None:
    """Spot checks of what each trap turns into: act-order perm, 3-bit widening, sym zeros, gs -1."""
    def first(name: str) -> QuantizedWeight:
        return _converted(fixtures_dir, name)[0][3]

    assert all(first(n).perm is not None for n in ("autogptq-w4-g128-asym-actorder", "ct-w4a16-g128-sym-actorder"))
    assert first("autogptq-w4-g128-sym").perm is None  # monotonic g_idx: no perm
    w3 = first("autogptq-w3-g128-asym")
    assert w3.bits == 4 and w3.zeros is not None and int(unpack_codes(w3.qweight, 4, w3.in_features).max()) <= 7
    assert first("autogptq-w4-g128-sym").zeros is None and first("ct-w8a16-g128-sym").zeros is None
    assert first("autogptq-w4-gall-sym").group_size == first("autogptq-w4-gall-sym").in_features
    gemm_sym = first("gptqmodel-awq-w4-g128")
    assert gemm_sym.zeros is not None  # zero_point false or not, stored qzeros are used


def test_gemv_equals_gemm(fixtures_dir: Path) -> None:
    """The GEMV fixture holds the same integers as gemm-g128 in another layout: identical dequant."""
    gemv, gemm = _converted(fixtures_dir, "autoawq-gemv-w4-g128"), _converted(fixtures_dir, "autoawq-gemm-w4-g128")
    assert [g[0] for g in gemv] == [g[0] for g in gemm]
    for (_, _, _, qw_v), (_, _, _, qw_m) in zip(gemv, gemm):
        _assert_qw_equal(qw_v, qw_m)


def _np_unpack_stream(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Independent decoder: int32 [W, M] -> codes [count, M], code i at global bits [b*i, b*i+b) (numpy bits)."""
    as_bytes = np.ascontiguousarray(words, dtype="<i4").view(np.uint8).reshape(words.shape[0], words.shape[1], 4)
    bit_rows = np.unpackbits(as_bytes, axis=2, bitorder="little")  # [W, M, 32]
    stream = bit_rows.transpose(0, 2, 1).reshape(-1, words.shape[1])[: count * bits]  # [count*b, M]
    weights = (1 << np.arange(bits)).reshape(1, bits, 1)
    return (stream.reshape(count, bits, -1) * weights).sum(axis=1)


@pytest.mark.parametrize(
    "name", ["autogptq-w4-g128-asym-actorder", "autogptq-w3-g128-asym", "gptqmodel-v2-w4-g128-asym", "autogptq-w8-g64-asym"]
)
def test_gptq_matches_independent_per_row_decode(fixtures_dir: Path, name: str) -> None:
    """formats.md 1.2-1.5 written out in numpy with per-row g_idx lookup: equal to the converter's result."""
    spec = _spec(_root(fixtures_dir) / name)
    b = spec.bits
    for prefix, parts, weight, qw in _converted(fixtures_dir, name):
        N, K = weight.shape
        q = _np_unpack_stream(parts["qweight"].numpy(), b, K)
        z = _np_unpack_stream(parts["qzeros"].numpy().T, b, N).T
        if spec.format == "gptq":
            z = (z + 1) % (1 << b)  # none of these files has a true zero of 0 (checked by the fixture tests)
        g = parts["g_idx"].numpy()
        s = parts["scales"].float().numpy()
        expect = ((q - z[g]) * s[g]).astype(np.float32).T  # [N, K]
        assert torch.equal(_dense_hf(qw), torch.from_numpy(expect)), prefix
        x = torch.randn(3, K)  # the perm is applied to the activations, not the outputs (T5)
        torch.testing.assert_close(quant_matmul_ref(x, qw), x @ torch.from_numpy(expect).T, rtol=1e-5, atol=1e-4)


def test_awq_matches_independent_decode(fixtures_dir: Path) -> None:
    name = "autoawq-gemm-w4-g64"
    reverse = [0, 4, 1, 5, 2, 6, 3, 7]  # column 8c+j is field reverse[j]
    for prefix, parts, weight, qw in _converted(fixtures_dir, name):
        N, K = weight.shape

        def cols(words: np.ndarray) -> np.ndarray:
            u = words.astype(np.int64) & 0xFFFFFFFF
            return np.stack([(u >> (4 * reverse[j])) & 0xF for j in range(8)], axis=2).reshape(words.shape[0], -1)

        q, z, s = cols(parts["qweight"].numpy()), cols(parts["qzeros"].numpy()), parts["scales"].float().numpy()
        g = np.arange(K) // 64
        expect = ((q - z[g]) * s[g]).astype(np.float32).T
        assert torch.equal(_dense_hf(qw), torch.from_numpy(expect)), prefix


def test_compressed_tensors_matches_independent_decode(fixtures_dir: Path) -> None:
    name = "ct-w4a16-g128-asym"
    for prefix, parts, weight, qw in _converted(fixtures_dir, name):
        N, K = weight.shape
        u = _np_unpack_stream(parts["weight_packed"].numpy().T, 4, K).T  # [N, K]
        uz = _np_unpack_stream(parts["weight_zero_point"].numpy(), 4, N)  # [N, G]
        g = np.arange(K) // 128
        s = parts["weight_scale"].float().numpy()
        expect = ((u - uz[:, g]) * s[:, g]).astype(np.float32)
        assert torch.equal(_dense_hf(qw), torch.from_numpy(expect)), prefix


def test_bounds_catch_zero_offset_and_perm_mistakes(fixtures_dir: Path) -> None:
    """The fixture bounds fail for the classic mistakes (T1, T5), so passing them means something."""
    name = "gptqmodel-w4-g128-asym-actorder"
    _, _, weight, qw = _converted(fixtures_dir, name)[0]
    assert _error_steps(qw, weight, False)[0] < MAX_MEAN_ABS_STEPS
    _, bias, _ = _error_steps(dataclasses.replace(qw, zeros=qw.zeros - 1), weight, False)  # v1 offset forgotten
    assert abs(bias) > 5 * MAX_MEAN_BIAS_STEPS
    mean_abs, _, _ = _error_steps(dataclasses.replace(qw, perm=None), weight, False)  # g_idx ignored
    assert mean_abs > 4 * MAX_MEAN_ABS_STEPS


def test_bounds_catch_awq_interleave_mistakes(fixtures_dir: Path) -> None:
    name = "autoawq-gemm-w4-g128"
    _, _, weight, qw = _converted(fixtures_dir, name)[0]
    K, N = qw.in_features, qw.out_features
    forward = [0, 2, 4, 6, 1, 3, 5, 7]  # applying the interleave instead of undoing it
    codes = unpack_codes(qw.qweight, 4, K).view(K, -1, 8)[:, :, forward].reshape(K, N)
    zeros = qw.zeros.view(qw.num_groups, -1, 8)[:, :, forward].reshape(qw.num_groups, N)
    assert _error_steps(qw, weight, True)[0] < MAX_MEAN_ABS_STEPS
    assert _error_steps(dataclasses.replace(qw, qweight=pack_codes(codes, 4)), weight, True)[0] > 2 * MAX_MEAN_ABS_STEPS
    assert _error_steps(dataclasses.replace(qw, zeros=zeros), weight, True)[0] > 1.2 * MAX_MEAN_ABS_STEPS
