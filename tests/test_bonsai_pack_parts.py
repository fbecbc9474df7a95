"""A tiny Hadamard pack (written and loaded by mlx-lm, ``workbench.real_models.hadamard_pack_writer``): its
projections checked one by one with mlx-lm's own modules as the subject (the recurrent
layer's and the attention head's), the head launch's rules and the wait table on the pack."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.check import check_packed_linear
from workbench.models import HeadRefusal, read_pack
from workbench.real_models import load_hadamard_pack as load_pack
from workbench.real_models import write_hadamard_pack as write_pack
from workbench.waits import waits_per_token

RECURRENT = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    folder = write_pack(tmp_path_factory.mktemp("bonsai_tiny_parts"))
    model, _ = load_pack(folder)
    return model, read_pack(folder)


def _module_subject(module):
    return lambda x: np.array(module(mx.array(x)))


@pytest.mark.parametrize(
    "path",
    [f"model.layers.0.linear_attn.{p}" for p in RECURRENT]
    + [f"model.layers.1.self_attn.{p}_proj" for p in "qkv"]
    + ["lm_head"],
)
def test_mlx_lm_projection_judged_correct(pack, path):
    model, p = pack
    module = dict(model.language_model.named_modules())[path]
    others = {q: p.matrix(q) for q in p.modules if not p.modules[q].embedding}
    report = check_packed_linear(_module_subject(module), p.matrix(path), others=others, seeds=range(40), name=path)
    assert report.passed, report.reasons
    faults = report.faults.groupby("fault")["worst"]
    # a rotation fault past frink-models' tolerance on every case; the bf16 scales on most
    assert (faults.min().drop("scales_bfloat16") > 2e-4).all()
    assert faults.median()["scales_bfloat16"] > 2e-4
    faults = faults.min()
    if p.modules[path].block:
        assert "rotation_skipped" in faults and any(f.startswith("signs_of_") for f in faults.index)


@pytest.mark.parametrize("bug", ["rotation_skipped", "other_signs", "scales_bfloat16"])
def test_mlx_lm_projection_with_a_bug_caught(pack, bug):
    model, p = pack
    path = "model.layers.0.linear_attn.in_proj_qkv"
    module = dict(model.language_model.named_modules())[path]
    signs, scales, biases, block = module.signs, module.scales, module.biases, module.block
    try:
        if bug == "rotation_skipped":
            module.block = 0
        elif bug == "other_signs":
            module.signs = dict(model.language_model.named_modules())["model.layers.0.linear_attn.in_proj_z"].signs
        else:
            module.scales, module.biases = scales.astype(mx.bfloat16), biases.astype(mx.bfloat16)
        report = check_packed_linear(_module_subject(module), p.matrix(path), seeds=range(20), name=bug)
    finally:
        module.signs, module.scales, module.biases, module.block = signs, scales, biases, block
    assert not report.passed


def test_head_launch_refused_for_the_packs_own_signs(pack):
    _, p = pack
    reasons = p.head_refusals(1)
    assert HeadRefusal.FOLDS_DIFFER in reasons  # q, k, v each carry their own signs
    assert {HeadRefusal.Q_NO_KERNEL, HeadRefusal.K_NO_KERNEL, HeadRefusal.V_NO_KERNEL} <= set(reasons)
    assert HeadRefusal.NOT_GQA in p.head_refusals(0)


def test_wait_table_reads_the_pack(pack):
    _, p = pack
    cfg = p.model_config()
    assert cfg.attention_layers() == [1]
    assert p.fusable_layers() == ()  # the kernels read no 2-bit weights and rotate wo's input only
    fused = waits_per_token(cfg, "fused_tail", eligible=(1,))
    assert waits_per_token(cfg, "fused_tail", eligible=p.fusable_layers()) == fused + 1


def test_bad_input_named(pack):
    from workbench.check import check_pack_tail
    from workbench.fold import WeightMatrix
    from workbench.models import PackError, pack_manifest
    from workbench.tail import pack_tail_weights

    _, p = pack
    w = pack_tail_weights(p, 1)
    with pytest.raises(ValueError, match="^w: must be TailWeights"):
        check_pack_tail(lambda sc: sc.residual, "not weights")
    with pytest.raises(ValueError, match="^faults: must be one of"):
        check_pack_tail(lambda sc: sc.residual, w, faults=("no_such_fault",))
    with pytest.raises(ValueError, match="^m: must be a quantized WeightMatrix"):
        check_packed_linear(lambda x: x, WeightMatrix(np.ones((4, 128), np.float32)))
    with pytest.raises(PackError, match="^config: must be the pack's config.json"):
        pack_manifest(["not", "a", "dict"])
    with pytest.raises(PackError, match="is not in the pack's manifest"):
        p.matrix("model.layers.1.mlp.no_such_proj")
    with pytest.raises(ValueError, match="^pack: must be a HadamardPack"):
        pack_tail_weights("folder", 1)
