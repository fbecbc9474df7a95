"""Bonsai-27B as it ships: a PrismML Hadamard pack written and loaded by mlx-lm 0.32.2's own
classes (``workbench.real_models.hadamard_pack_writer``), read by the workbench, and a layer of it checked with
mlx-lm's own modules as the implementation under test."""

from __future__ import annotations

import copy

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models import prism_hadamard_qwen35 as prism

from workbench.check import PACK_FAULTS, CallableSubject, check_pack_tail, packed_faulty_tail, stored_case
from workbench.check.pack_faults import applies as pack_fault_applies
from workbench.fold import AFFINE2, WeightMatrix
from workbench.kernels.launch import prepare_tail
from workbench.models import PACK_BLOCKS, PackError, pack_manifest, pack_refusals, read_pack
from workbench.real_models import load_hadamard_pack as load_pack
from workbench.real_models import write_hadamard_pack as write_pack
from workbench.tail import fused_tail, host_tail, pack_tail_weights, random_inputs, tail_launch, worst_scaled_error

LAYER = 1  # the tiny model's full-attention layer (full_attention_interval 2)


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = write_pack(tmp_path_factory.mktemp("bonsai_tiny"))
    model, config = load_pack(folder)
    return folder, model, config, read_pack(folder)


def _tail_subject(model, name):
    """mlx-lm's own modules of the layer's tail: DecoderLayer's ``h = x + attn``, ``h + mlp(norm(h))``."""
    layer = model.language_model.model.layers[LAYER]

    def run(sc):
        h = mx.array(sc.residual) + layer.self_attn.o_proj(mx.array(sc.branch))
        return np.array(h + layer.mlp(layer.post_attention_layernorm(h)))

    return CallableSubject(run, batched=True, name=name, process=False)


def test_pack_constants_are_mlx_lms():
    assert PACK_BLOCKS == prism._BLOCKS
    assert (AFFINE2.mode, AFFINE2.bits, AFFINE2.group_size) == (
        prism._QUANTIZATION["mode"],
        prism._QUANTIZATION["bits"],
        prism._QUANTIZATION["group_size"],
    )
    assert not AFFINE2.served  # the kernels' text decodes 4- and 8-bit codes only


@pytest.mark.parametrize(
    "change",
    [
        {"schema_version": 2},
        {"tensor_namespace": "mlx-vlm-qwen3_5"},
        {"gdn_activation_layout": "interleaved"},
        {"quantization": {"bits": 4, "group_size": 64, "mode": "affine"}},
        {"modules": []},
    ],
)
def test_manifest_refused_where_mlx_lm_refuses(pack, change):
    folder, _, config, _ = pack
    bad = {**config, **change}
    with pytest.raises(ValueError) as theirs:
        prism.ModelArgs.from_dict(bad)
    with pytest.raises(PackError) as ours:
        pack_manifest(bad)
    # the same rule named: the first words of mlx-lm's message appear in ours
    assert str(theirs.value).split(",")[0].split(":")[0][:20] in str(ours.value)


@pytest.mark.parametrize("edit", ["duplicate", "dtype", "block"])
def test_module_records_refused_where_mlx_lm_refuses(pack, edit):
    _, _, config, _ = pack
    mods = copy.deepcopy(config["modules"])
    if edit == "duplicate":
        mods.append(dict(mods[0]))
    elif edit == "dtype":
        mods[0]["dtype"] = "bfloat16"
    else:
        mods[0]["block"] = 256
    bad = {**config, "modules": mods}
    with pytest.raises(ValueError):
        prism.Model(prism.ModelArgs.from_dict(bad))
    with pytest.raises(PackError, match="Duplicate|dtype|block"):
        pack_manifest(bad)


def test_pack_read_as_mlx_lm_loaded_it(pack):
    folder, model, config, p = pack
    assert set(p.modules) == {r["path"] for r in config["modules"]}
    loaded = dict(model.language_model.named_modules())
    for path, rec in p.modules.items():
        if rec.embedding:
            continue
        m, mine = loaded[path], p.matrix(path)
        assert isinstance(m, prism.HadamardQuantizedLinear) and m.block == rec.block
        base, fold = mine.launch_parts()
        assert np.array_equal(np.array(base.w), np.array(m.weight)) and base.scales.dtype == mx.float16
        assert np.array_equal(np.array(base.scales), np.array(m.scales))
        assert (fold is None) == (rec.block == 0)
        if fold is not None:
            assert fold.block == m.block and np.array_equal(fold.signs, np.array(m.signs))
        # the module's output against the float64 map of the same stored codes (its rotation applied)
        x = np.random.default_rng(0).standard_normal((3, mine.shape[1])).astype(np.float32)
        truth = (fold.rotate(x.astype(np.float64)) if fold is not None else x.astype(np.float64)) @ mine.dense(
            np.float64
        ).T
        got = np.array(m(mx.array(x))).astype(np.float64)
        assert np.abs(got - truth).max() <= 1e-5 * max(1.0, np.abs(truth).max())


def test_float64_weights_from_codes_match_mlx_dequantize(pack):
    *_, p = pack
    m = p.matrix(f"model.layers.{LAYER}.mlp.down_proj")
    assert m.dtype == "affine2-g128"
    exact = m.dense(np.float64)
    base, _ = m.launch_parts()
    theirs = np.array(
        mx.dequantize(base.w, base.scales.astype(mx.float32), base.biases.astype(mx.float32), group_size=128, bits=2)
    )
    assert np.array_equal(exact, theirs.astype(np.float64))  # exact here: f16 scale*q + bias fits a float32


def test_missing_signs_refused(pack, tmp_path):
    folder, *_ = pack
    import json
    import shutil

    for f in folder.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    weights = mx.load(str(tmp_path / "model.safetensors"))
    key = next(k for k in weights if k.endswith("o_proj.signs"))
    del weights[key]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PackError, match="Missing Hadamard sign vector"):
        read_pack(tmp_path)


def test_tail_truth_and_reference_apply_every_rotation(pack):
    *_, p = pack
    w = pack_tail_weights(p, LAYER)
    assert all(getattr(w, k).fold is not None for k in ("wo", "gate", "up", "down"))
    assert w.down.fold.block == 1024 and w.gate.fold.block == 512
    br, res = random_inputs(w, seed=3, batch=2)
    truth = host_tail(w, br, res)
    ref = fused_tail(w, br, res, backend="graph")
    assert np.abs(ref - truth).max() <= 1e-5 * np.abs(truth).max()
    # without gate/up/down's rotations the truth moves far: the rotations are really applied
    bare = type(w)(w.wo, w.ffn_norm, *(WeightMatrix(getattr(w, k).launch_parts()[0]) for k in ("gate", "up", "down")))
    assert np.abs(host_tail(bare, br, res) - truth).max() > 1e-2 * np.abs(truth).max()


def test_kernels_refuse_saying_which(pack):
    *_, p = pack
    reasons = pack_refusals(p, LAYER)
    assert any(r.startswith("wo ") and "affine2-g128" in r for r in reasons)
    assert sum("rotate wo's input only" in r for r in reasons) == 3  # gate, up, down
    w = pack_tail_weights(p, LAYER)
    for dialect in ("metal", "cuda"):  # the kernels' own refusal, before anything is built
        with pytest.raises(ValueError, match="affine2-g128"):
            prepare_tail(tail_launch(w), dialect)


def test_mlx_lm_modules_judged_correct(pack):
    _, model, _, p = pack
    faults = ("rotation_skipped_down", "gate_with_up_signs", "scales_bfloat16")
    w = pack_tail_weights(p, LAYER)
    report = check_pack_tail(_tail_subject(model, "mlx-lm"), w, seeds=range(30), faults=faults)
    assert report.passed, report.reasons
    caught = report.faults.groupby("fault")["worst"].min()
    assert set(caught.index) == set(faults) and (caught > 2e-4).all(), caught


def test_every_pack_fault_moves_the_tail_and_none_is_the_float32_tail(pack):
    *_, p = pack
    w = pack_tail_weights(p, LAYER)
    br, res = random_inputs(w, seed=7)
    B, R = br[None] * np.float32([[0.01], [1.0], [100.0]]), res[None] * np.float32([[0.01], [1.0], [100.0]])
    sc, truth = stored_case(w, B, R, "one"), host_tail(w, B, R)
    assert worst_scaled_error(packed_faulty_tail(sc, None), truth).max() < 2e-4
    for fault in PACK_FAULTS:
        assert pack_fault_applies(fault, sc), fault  # every rotation is there on the tiny pack
        assert worst_scaled_error(packed_faulty_tail(sc, fault), truth).min() > 2e-4, fault


@pytest.mark.parametrize("bug", ["down_unrotated", "scales_bfloat16"])
def test_mlx_lm_kernel_with_a_pack_bug_caught(pack, bug):
    """mlx-lm's own modules with one bug put in: down's rotation skipped (its block set to 0, as
    HadamardQuantizedLinear skips it), or every scale and bias read as bfloat16."""
    folder, *_ = pack
    model, _ = load_pack(folder)  # a fresh copy: the bug stays in this test
    layer = model.language_model.model.layers[LAYER]
    mods = [layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj]
    if bug == "down_unrotated":
        layer.mlp.down_proj.block = 0
    else:
        for m in mods:
            m.scales, m.biases = m.scales.astype(mx.bfloat16), m.biases.astype(mx.bfloat16)
    w = pack_tail_weights(read_pack(folder), LAYER)
    report = check_pack_tail(_tail_subject(model, bug), w, seeds=range(20), faults=())
    assert not report.passed
    assert any("not those of a correct float32 tail" in r for r in report.reasons)


def test_the_checks_random_draw_takes_the_format():
    """affine2 with float16 scales through check_kernel's own draw (wo folded), as `--quantize affine2`."""
    from bench.check_rate import numpy_tail
    from workbench.check import check_kernel

    report = check_kernel(
        numpy_tail,
        shapes=((128, 256, 384),),
        quantize=("affine2",),
        dtypes=("float16",),
        folds=(128,),
        seeds=range(100),
    )
    assert report.passed, report.reasons
    assert set(report.cases["quant"]) == {"affine2-g128"}
