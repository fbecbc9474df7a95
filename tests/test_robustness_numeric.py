"""Every numeric public call answers with a result or a clear error.

The contract, for the numeric API (hadamard, fold, weights, model, refusals, tail,
comparison, sweep_cases, sweeps, three_way, exact_oracle, kernel_launch's tuning,
frink_case): valid input gives a finite result equal to its oracle; invalid input raises
``ValueError`` (``BackendUnavailable`` for an absent backend) whose message starts with
the parameter's name; no other exception type escapes, nothing hangs, nothing is
silently replaced. Three parts:

* a table of the bad and odd inputs tried by hand (each with the parameter its error
  must name), and the natural inputs that must be accepted (numpy scalars, lists);
* regression tests for the defects found that way;
* property tests (hypothesis): valid configs, folds, weights, tails, sweeps and
  comparisons against their oracles, and every argument of the public calls replaced
  by arbitrary junk.
"""

from __future__ import annotations

import math
import re
import tracemalloc
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench import tail as T
from workbench.backends import BackendUnavailable, available_backends
from workbench.fold import hadamard
from workbench.fold import weights as W
from workbench.fold.rotation import FoldSite, HadamardFold
from workbench.fold.weights import WeightMatrix
from workbench.kernels import tuning as KL
from workbench.models import config as M
from workbench.models import families as MF
from workbench.models import loader as ML
from workbench.models import refusals as R
from workbench.studies import cases as SC
from workbench.studies import exact_oracle as EO
from workbench.studies import sweeps
from workbench.studies import three_way as TW
from workbench.tail import comparison as C
from workbench.tail import frink_case as FC

NAN, INF = float("nan"), float("inf")

# -- small fixtures, built once (cheap: hidden 32, branch 32, ffn 64) ------------------------

WTS = T.TailWeights.random(32, 32, 64, seed=0, fold_block=16)
BR, RES = T.random_inputs(WTS, seed=1)
BONSAI = ML.load_model("bonsai-27b")
W_NAN = np.ones((8, 64), np.float32)
W_NAN[3, 5] = NAN
#: float64 with one finite value float32 cannot hold (numpy's cast makes it inf with a warning).
F64_HUGE = np.ones((8, 8))
F64_HUGE[2, 3] = 1e39
#: from_arrays' (wo, ffn_norm, gate, up, down) of a hidden 8, branch 8, ffn 8 tail.
ONES8 = (np.ones((8, 8)), np.ones(8), np.ones((8, 8)), np.ones((8, 8)), np.ones((8, 8)))


def qwen3(**kw: Any) -> dict:
    """A small dense qwen3 config.json, with ``kw`` changed."""
    d = dict(
        model_type="qwen3",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        hidden_act="silu",
    )
    return {**d, **kw}


def jamba(**kw: Any) -> dict:
    d = dict(
        model_type="jamba",
        hidden_size=64,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attn_layer_period=4,
        attn_layer_offset=2,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
    )
    return {**d, **kw}


def qwen_next(**kw: Any) -> dict:
    d = dict(
        model_type="qwen3_next",
        hidden_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        moe_intermediate_size=32,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        full_attention_interval=2,
        num_experts=4,
    )
    return {**d, **kw}


def cfg(d: dict) -> M.ModelConfig:
    return MF.from_hf_config(d)


def sweep1(**kw: Any):
    return sweeps.sweep(**{"shapes": [(8, 8, 8)], "seeds": range(2), "progress": False, **kw})


def assert_clear(fn: Callable[[], Any], param: str) -> None:
    """``fn()`` raises a ValueError whose message starts by naming ``param``, and nothing else."""
    try:
        fn()
    except ValueError as e:
        msg = str(e)
        assert re.match(rf"^{re.escape(param)}[: ]", msg), f"the error does not start with {param!r}: {msg}"
    except BackendUnavailable:
        pass
    else:
        raise AssertionError(f"no error: expected a ValueError naming {param!r}")


# -- the table: (label, call, the parameter its error must name) ---------------------------

BAD: list[tuple[str, Callable[[], Any], str]] = [
    # hadamard and folds
    ("block 36 (m = 9 is not a Hadamard order)", lambda: hadamard.factor_block(36), "block"),
    ("block '16'", lambda: HadamardFold("16"), "block"),
    ("block_transform width 10 for block 4", lambda: hadamard.block_transform(np.ones(10), 4), "x"),
    ("block_transform of a 0-d array", lambda: hadamard.block_transform(np.float64(1.0), 4), "x"),
    ("block_transform of a string", lambda: hadamard.block_transform("abc", 4), "x"),
    ("a dense Hadamard matrix of 2**20", lambda: hadamard.hadamard_matrix(2**20), "n"),
    ("table(3)", lambda: hadamard.table(3), "m"),
    ("signs with a 2", lambda: HadamardFold(4, [1, 2, 1, 1]), "signs"),
    ("signs as a string", lambda: HadamardFold(4, "abcd"), "signs"),
    ("signs with a None", lambda: HadamardFold(4, [1, None, 1, 1]), "signs"),
    ("signs with a NaN", lambda: HadamardFold(4, [1, NAN, 1, 1]), "signs"),
    ("perm of floats", lambda: HadamardFold(4, None, [0.0, 1.0, 2.0, 3.0]), "perm"),
    ("perm with a repeat", lambda: HadamardFold(4, None, [0, 0, 1, 2]), "perm"),
    ("ragged perm", lambda: HadamardFold(4, None, [[0], [1, 2]]), "perm"),
    ("signs and perm of different lengths", lambda: HadamardFold(4, [1] * 8, list(range(4))), "signs/perm"),
    ("site 'input'", lambda: HadamardFold(16, site="input"), "site"),
    ("with_site('output')", lambda: HadamardFold(16).with_site("output"), "site"),
    ("random dim True", lambda: HadamardFold.random(True, 1, seed=0), "dim"),
    ("random seed -1", lambda: HadamardFold.random(16, 16, seed=-1), "seed"),
    ("random seed 'a'", lambda: HadamardFold.random(16, 16, seed="a"), "seed"),
    ("random permute 'yes'", lambda: HadamardFold.random(16, 16, seed=0, permute="yes"), "permute"),
    ("random dim 10**12", lambda: HadamardFold.random(16 * 10**11, 16, seed=0), "dim"),
    ("rotate a 0-d array", lambda: HadamardFold(16).rotate(np.float64(1)), "x"),
    ("rotate a string", lambda: HadamardFold(16).rotate("abc"), "x"),
    ("rotate the wrong width", lambda: HadamardFold(16).rotate(np.ones(8)), "width"),
    ("a dense rotation of 16e6", lambda: HadamardFold(16).matrix(16 * 10**6), "dim"),
    ("check_width(32.0)", lambda: HadamardFold(16).check_width(32.0), "width"),
    ("same_rotation of an int", lambda: HadamardFold(16).same_rotation(3), "other"),
    ("same_rotation of a fold's name", lambda: HadamardFold(16).same_rotation("hadamard16"), "other"),
    # weights
    ("a 1-D base", lambda: WeightMatrix(np.ones(4, np.float32)), "base"),
    ("a string base", lambda: WeightMatrix("abc"), "base"),
    ("an int base", lambda: WeightMatrix(np.ones((2, 2), np.int32)), "base"),
    ("a float64 base beyond float32's range", lambda: WeightMatrix(F64_HUGE), "base"),
    ("a list base beyond float32's range", lambda: WeightMatrix(F64_HUGE.tolist()), "base"),
    ("quantize a float64 weight beyond float32's range", lambda: WeightMatrix.quantize(np.full((8, 64), 1e39)), "w"),
    ("quantize a 1-D weight", lambda: WeightMatrix.quantize(np.ones(64, np.float32)), "w"),
    ("fold 'fold'", lambda: WeightMatrix(np.ones((4, 4), np.float32), "fold"), "fold"),
    ("quantize a NaN weight", lambda: WeightMatrix.quantize(W_NAN), "w"),
    ("quantize an Inf weight", lambda: WeightMatrix.quantize(np.full((8, 64), INF, np.float32)), "w"),
    ("bits True", lambda: WeightMatrix.quantize(np.ones((8, 64), np.float32), bits=True), "bits"),
    ("bits 4.0", lambda: WeightMatrix.quantize(np.ones((8, 64), np.float32), bits=4.0), "bits"),
    ("mode ['affine']", lambda: WeightMatrix.quantize(np.ones((8, 64), np.float32), mode=["affine"]), "mode"),
    ("group 64 over 32 columns", lambda: WeightMatrix.quantize(np.ones((8, 32), np.float32)), "group_size"),
    ("apply a 0-d array", lambda: WeightMatrix(np.ones((4, 4), np.float32)).apply(np.float64(1)), "x"),
    ("apply a string", lambda: WeightMatrix(np.ones((4, 4), np.float32)).apply("abcd"), "x"),
    ("apply MLX of the wrong width", lambda: WeightMatrix(np.ones((4, 4), np.float32)).apply(mx.ones((3,))), "x"),
    ("dense(np.int32)", lambda: WeightMatrix(np.ones((4, 4), np.float32)).dense(np.int32), "dtype"),
    ("dense('banana')", lambda: WeightMatrix(np.ones((4, 4), np.float32)).dense("banana"), "dtype"),
    ("outlier_matrix out_dim -1", lambda: W.outlier_matrix(-1, 4, n_outliers=0, outlier_scale=1.0, seed=0), "out_dim"),
    ("outlier_scale NaN", lambda: W.outlier_matrix(4, 4, n_outliers=0, outlier_scale=NAN, seed=0), "outlier_scale"),
    ("n_outliers True", lambda: W.outlier_matrix(4, 4, n_outliers=True, outlier_scale=2.0, seed=0), "n_outliers"),
    (
        "quantization_error of a NaN weight",
        lambda: W.quantization_error(W_NAN, mode="affine", bits=4, group_size=64),
        "w",
    ),
    (
        "a format that is not a pair",
        lambda: W.quantization_study(np.ones((8, 64), np.float32), {"none": None}, (("x",),)),
        "formats",
    ),
    ("a fold that is an int", lambda: W.quantization_study(np.ones((8, 64), np.float32), {"none": 3}), "folds"),
    # configs
    ("rms_norm_eps -1", lambda: cfg(qwen3(rms_norm_eps=-1)), "rms_norm_eps"),
    ("rms_norm_eps 0", lambda: cfg(qwen3(rms_norm_eps=0)), "rms_norm_eps"),
    ("rms_norm_eps NaN", lambda: cfg(qwen3(rms_norm_eps=NAN)), "rms_norm_eps"),
    ("10**9 layers", lambda: cfg(qwen3(num_hidden_layers=10**9)), "num_hidden_layers"),
    ("Jamba offset past the period", lambda: cfg(jamba(attn_layer_offset=4)), "attn_layer_offset"),
    ("Jamba offset -1", lambda: cfg(jamba(attn_layer_offset=-1)), "attn_layer_offset"),
    ("Jamba expert offset past the period", lambda: cfg(jamba(expert_layer_offset=5)), "expert_layer_offset"),
    ("mlp_only_layers ['3']", lambda: cfg(qwen_next(mlp_only_layers=["3"])), "mlp_only_layers[0]"),
    ("mlp_only_layers [[3]]", lambda: cfg(qwen_next(mlp_only_layers=[[3]])), "mlp_only_layers[0]"),
    ("mlp_only_layers [30] of 4", lambda: cfg(qwen_next(mlp_only_layers=[30])), "mlp_only_layers[0]"),
    ("num_experts -2", lambda: cfg(qwen_next(num_experts=-2)), "num_experts"),
    ("Jamba num_experts -2", lambda: cfg(jamba(num_experts=-2)), "num_experts"),
    ("decoder_sparse_step -1", lambda: cfg(qwen_next(decoder_sparse_step=-1)), "decoder_sparse_step"),
    ("a list for a config", lambda: MF.from_hf_config([1, 2]), "path_or_dict"),
    ("hidden_size 64.0", lambda: cfg(qwen3(hidden_size=64.0)), "hidden_size"),
    (
        "residual_multiplier NaN",
        lambda: cfg(qwen3(model_type="granite", residual_multiplier=NAN)),
        "residual_multiplier",
    ),
    ("name 3", lambda: MF.from_hf_config(qwen3(), name=3), "name"),
    ("layer '3'", lambda: BONSAI.layer("3"), "layer"),
    ("layer -1", lambda: BONSAI.layer(-1), "layer"),
    ("synthetic hidden 0", lambda: M.ModelConfig.synthetic(0, ffn_dim=4), "hidden"),
    ("synthetic hidden '64'", lambda: M.ModelConfig.synthetic("64", ffn_dim=4), "hidden"),
    ("synthetic 0 heads", lambda: M.ModelConfig.synthetic(64, ffn_dim=4, num_q_heads=0), "num_q_heads"),
    ("synthetic eps -1", lambda: M.ModelConfig.synthetic(64, ffn_dim=4, rms_norm_eps=-1), "rms_norm_eps"),
    ("synthetic ffn 4.5", lambda: M.ModelConfig.synthetic(64, ffn_dim=4.5), "ffn_dim"),
    (
        "LayerConfig heads '4'",
        lambda: M.LayerConfig(0, M.Mixer.ATTENTION, "4", 2, 16, 8, "dense", "swiglu"),
        "num_q_heads",
    ),
    ("LayerConfig index -1", lambda: M.LayerConfig(-1, M.Mixer.MAMBA2), "index"),
    ("LayerConfig ffn_act None", lambda: M.LayerConfig(0, M.Mixer.MAMBA2, ffn_act=None), "ffn_act"),
    (
        "ModelConfig name None",
        lambda: M.ModelConfig(None, "x", 64, 1, 1e-6, (M.LayerConfig(0, M.Mixer.MAMBA2),)),
        "name",
    ),
    (
        "ModelConfig eps -1",
        lambda: M.ModelConfig("x", "x", 64, 1, -1.0, (M.LayerConfig(0, M.Mixer.MAMBA2),)),
        "rms_norm_eps",
    ),
    ("ModelConfig layers [3]", lambda: M.ModelConfig("x", "x", 64, 1, 1e-6, [3]), "layers"),
    ("load_model(3)", lambda: ML.load_model(3), "name"),
    ("load_model('../x')", lambda: ML.load_model("../x"), "name"),
    ("replace_layer foo=1", lambda: M.replace_layer(BONSAI, 3, foo=1), "changes"),
    ("replace_layer layer 300", lambda: M.replace_layer(BONSAI, 300, ffn_dim=3), "layer"),
    # refusals
    ("refusals layer '3'", lambda: R.layer_refusals(BONSAI, "3"), "layer"),
    ("refusals cfg 'bonsai'", lambda: R.layer_refusals("bonsai", 3), "cfg"),
    ("kernels_enabled 'no'", lambda: R.layer_refusals(BONSAI, 3, kernels_enabled="no"), "kernels_enabled"),
    ("refusal_table(None)", lambda: R.refusal_table(None), "cfg"),
    ("model_summary of names", lambda: R.model_summary(["bonsai"]), "cfgs[0]"),
    ("head_launch_refusals layer 'x'", lambda: R.head_launch_refusals(BONSAI, "x"), "layer"),
    ("explain('abc')", lambda: R.explain("abc"), "reasons"),
    # tails
    ("host_tail of a string", lambda: T.host_tail(WTS, "abc", RES), "branch"),
    ("host_tail of a 0-d branch", lambda: T.host_tail(WTS, np.float32(1), RES), "branch"),
    ("host_tail of a ragged list", lambda: T.host_tail(WTS, [[1.0], [1.0, 2.0]], RES), "branch"),
    ("host_tail dtype int32", lambda: T.host_tail(WTS, BR, RES, dtype=np.int32), "dtype"),
    ("host_tail dtype 'banana'", lambda: T.host_tail(WTS, BR, RES, dtype="banana"), "dtype"),
    ("host_tail of no weights", lambda: T.host_tail(None, BR, RES), "w"),
    (
        "batch axes that differ",
        lambda: T.host_tail(WTS, np.zeros((2, 32), np.float32), np.zeros((3, 32))),
        "branch/residual",
    ),
    ("backend 'gpu'", lambda: T.fused_tail(WTS, BR, RES, backend="gpu"), "backend"),
    ("backend None", lambda: T.fused_tail(WTS, BR, RES, backend=None), "backend"),
    (
        "fused branch beyond float32's range",
        lambda: T.fused_tail(WTS, np.where(np.arange(BR.size) == 3, 1e39, BR.astype(np.float64)), RES, backend="graph"),
        "branch",
    ),
    (
        "fused residual beyond float32's range",
        lambda: T.fused_tail(WTS, BR, np.full(RES.shape, -1e39), backend="graph"),
        "residual",
    ),
    (
        "return_backend 'yes'",
        lambda: T.fused_tail(WTS, BR, RES, backend="graph", return_backend="yes"),
        "return_backend",
    ),
    (
        "fused kernels_enabled 'no'",
        lambda: T.fused_tail(WTS, BR, RES, backend="graph", kernels_enabled="no"),
        "kernels_enabled",
    ),
    ("to_mx('abc')", lambda: T.to_mx("abc"), "a"),
    ("tail_launch(None)", lambda: T.tail_launch(None), "w"),
    ("random_inputs batch -1", lambda: T.random_inputs(WTS, seed=0, batch=-1), "batch"),
    ("random_inputs batch '2'", lambda: T.random_inputs(WTS, seed=0, batch="2"), "batch"),
    ("random_inputs seed 'a'", lambda: T.random_inputs(WTS, seed="a"), "seed"),
    ("random_inputs of no weights", lambda: T.random_inputs(None, seed=0), "w"),
    ("random_inputs batch 10**9", lambda: T.random_inputs(WTS, seed=0, batch=10**9), "batch"),
    ("case_recipe hidden -1", lambda: T.case_recipe(-1, 2, 3), "hidden"),
    ("TailWeights.random seed -1", lambda: T.TailWeights.random(8, 8, 8, seed=-1), "seed"),
    ("TailWeights.random seed 1.5", lambda: T.TailWeights.random(8, 8, 8, seed=1.5), "seed"),
    (
        "TailWeights.random a model's name as config",
        lambda: T.TailWeights.random(8, 8, 8, seed=0, config="bonsai-27b", layer=3),
        "config",
    ),
    ("TailWeights.for_layer a model's name", lambda: T.TailWeights.for_layer("bonsai-27b", 3, seed=0), "config"),
    ("TailWeights.for_layer no config", lambda: T.TailWeights.for_layer(None, 3, seed=0), "config"),
    (
        "TailWeights.random quantize of an unknown key",
        lambda: T.TailWeights.random(8, 8, 8, seed=0, quantize={"bit": 4}),
        "quantize",
    ),
    ("TailWeights.random fold_block 3", lambda: T.TailWeights.random(8, 8, 8, seed=0, fold_block=3), "fold_block"),
    (
        "TailWeights.random fold_permute 'yes'",
        lambda: T.TailWeights.random(8, 8, 8, seed=0, fold_block=4, fold_permute="yes"),
        "fold_permute",
    ),
    (
        "TailWeights.random fold_site 'input'",
        lambda: T.TailWeights.random(8, 8, 8, seed=0, fold_site="input"),
        "fold_site",
    ),
    ("TailWeights.random hidden 2**40", lambda: T.TailWeights.random(2**40, 8, 8, seed=0), "hidden"),
    ("from_arrays wo beyond float32's range", lambda: T.TailWeights.from_arrays(F64_HUGE, *ONES8[1:]), "wo"),
    ("from_arrays down beyond float32's range", lambda: T.TailWeights.from_arrays(*ONES8[:4], F64_HUGE), "down"),
    (
        "from_arrays ffn_norm beyond float32's range",
        lambda: T.TailWeights.from_arrays(ONES8[0], np.full(8, -1e39), *ONES8[2:]),
        "ffn_norm",
    ),
    (
        "TailWeights of an ffn_norm beyond float32's range",
        lambda: T.TailWeights(WTS.wo, np.full(32, 1e39), WTS.gate, WTS.up, WTS.down),
        "ffn_norm",
    ),
    ("from_arrays wo of strings", lambda: T.TailWeights.from_arrays("abc", *ONES8[1:]), "wo"),
    ("from_arrays a 1-D up", lambda: T.TailWeights.from_arrays(*ONES8[:3], np.ones(8), ONES8[4]), "up"),
    # comparison
    ("tol True", lambda: C.compare(np.ones(3), np.ones(3), tol=True), "tol"),
    ("tol -1", lambda: C.compare(np.ones(3), np.ones(3), tol=-1), "tol"),
    ("shapes that differ", lambda: C.compare(np.ones(3), np.ones(4)), "actual/expected"),
    ("compare a string", lambda: C.compare("abc", np.ones(3)), "actual"),
    ("compare None", lambda: C.compare(None, np.ones(3)), "actual"),
    ("compare empty arrays", lambda: C.compare(np.ones(0), np.ones(0)), "actual/expected"),
    ("compare complex numbers", lambda: C.compare(np.ones(3) * 1j, np.ones(3)), "actual"),
    ("scaled_error of strings", lambda: C.scaled_error("a", "b"), "actual"),
    ("worst_scaled_error of scalars", lambda: C.worst_scaled_error(1.0, 1.0), "actual/expected"),
    ("nmse of strings", lambda: C.nmse(["a"], ["b"]), "actual"),
    ("torch_ratio dtype int8", lambda: C.torch_ratio(np.ones(3), np.ones(3), dtype="int8"), "dtype"),
    ("ulp_distance dtype float64", lambda: C.ulp_distance(np.ones(3), np.ones(3), dtype="float64"), "dtype"),
    # sweep cases and sweeps
    ("case_weights seed -1", lambda: SC.case_weights((8, 8, 8), -1), "seed"),
    ("case_weights seed 'a'", lambda: SC.case_weights((8, 8, 8), "a"), "seed"),
    ("case_weights seed 1.5", lambda: SC.case_weights((8, 8, 8), 1.5), "seed"),
    ("case_weights shape 'abc'", lambda: SC.case_weights("abc", 0), "shapes"),
    ("case_weights shape 8.5", lambda: SC.case_weights((8.5, 8, 8), 0), "shapes"),
    ("case_weights shape of four", lambda: SC.case_weights((8, 8, 8, 8), 0), "shapes"),
    ("case_weights dtype int8", lambda: SC.case_weights((8, 8, 8), 0, dtype="int8"), "dtype"),
    ("case_weights eps -1", lambda: SC.case_weights((8, 8, 8), 0, eps=-1), "eps"),
    ("case_weights fold 3", lambda: SC.case_weights((8, 8, 8), 0, fold=3), "folds"),
    ("case_weights 9 outliers of 8", lambda: SC.case_weights((8, 8, 8), 0, wo_outliers=9), "wo_outliers"),
    ("case_weights affine4 at width 8", lambda: SC.case_weights((8, 8, 8), 0, quantize="affine4"), "quantize"),
    ("case_weights of a 3 TB case", lambda: SC.case_weights((5120, 6144, 10**7), 0), "shapes"),
    ("case_arrays seeds 'abc'", lambda: SC.case_arrays((8, 8, 8), "abc"), "seeds"),
    ("case_arrays seeds [1.0]", lambda: SC.case_arrays((8, 8, 8), [1.0]), "seeds"),
    ("case_arrays seeds [[1]]", lambda: SC.case_arrays((8, 8, 8), [[1]]), "seeds"),
    ("case_arrays seeds None", lambda: SC.case_arrays((8, 8, 8), None)[0], "seeds"),
    ("case_arrays seed 2**70", lambda: SC.case_arrays((8, 8, 8), [2**70]), "seeds"),
    ("sweep shapes 'abc'", lambda: sweep1(shapes="abc"), "shapes"),
    ("sweep shapes []", lambda: sweep1(shapes=[]), "shapes"),
    ("sweep seeds []", lambda: sweep1(seeds=[]), "seeds"),
    ("sweep dtypes 'float32'", lambda: sweep1(dtypes="float32"), "dtypes"),
    ("sweep dtypes ()", lambda: sweep1(dtypes=()), "dtypes"),
    ("sweep folds ()", lambda: sweep1(folds=()), "folds"),
    ("sweep folds 4", lambda: sweep1(folds=4), "folds"),
    ("sweep quantize 'affine4'", lambda: sweep1(quantize="affine4"), "quantize"),
    ("sweep eps True", lambda: sweep1(eps=True), "eps"),
    ("sweep backends None", lambda: sweep1(backends=None), "backends"),
    ("sweep backends ('auto',)", lambda: sweep1(backends=("auto",)), "backends"),
    ("sweep backends ('gpu',)", lambda: sweep1(backends=("gpu",)), "backends"),
    ("sweep progress 'no'", lambda: sweep1(progress="no"), "progress"),
    ("sweep wo_outliers -1", lambda: sweep1(wo_outliers=-1), "wo_outliers"),
    ("sweep of a 3 TB case", lambda: sweep1(shapes=[(5120, 6144, 10**7)]), "shapes"),
    (
        "mutation_sweep mutations 'wrong'",
        lambda: sweeps.mutation_sweep(shapes=[(8, 8, 8)], seeds=range(2), mutations="wrong"),
        "mutations",
    ),
    (
        "mutation_sweep mutations [None]",
        lambda: sweeps.mutation_sweep(shapes=[(8, 8, 8)], seeds=range(2), mutations=[None]),
        "mutations",
    ),
    # three-way, exact oracle
    ("three_way of a NaN branch", lambda: TW.three_way(WTS, np.where(np.arange(32) == 3, NAN, BR), RES), "branch"),
    ("three_way of an Inf residual", lambda: TW.three_way(WTS, BR, np.where(np.arange(32) == 0, INF, RES)), "residual"),
    ("three_way tol -1", lambda: TW.three_way(WTS, BR, RES, tol=-1), "tol"),
    ("three_way fault 'bad'", lambda: TW.three_way(WTS, BR, RES, fault="bad"), "fault"),
    ("three_way backend 'bad'", lambda: TW.three_way(WTS, BR, RES, backend="bad"), "backend"),
    ("three_way of no weights", lambda: TW.three_way(None, BR, RES), "w"),
    ("three_way_table of pairs", lambda: TW.three_way_table([("a", WTS)]), "cases[0]"),
    ("three_way_table('abc')", lambda: TW.three_way_table("abc"), "cases"),
    ("faulty_fused_tail fault 'x'", lambda: TW.faulty_fused_tail(WTS, BR, RES, "x"), "fault"),
    ("verdict(None, None)", lambda: TW.verdict(None, None), "fused_vs_truth"),
    ("nice_ceil('a')", lambda: EO.nice_ceil("a"), "x"),
    ("oracle_tolerance(NaN)", lambda: EO.oracle_tolerance(NAN), "f32_worst"),
    ("oracle_tolerance(-1)", lambda: EO.oracle_tolerance(-1), "f32_worst"),
    ("dequantize_exact('a')", lambda: EO.dequantize_exact("a"), "wm"),
    ("dequantize_exact dtype 'banana'", lambda: EO.dequantize_exact(WTS.wo, "banana"), "dtype"),
    ("host_tail_exact of no weights", lambda: EO.host_tail_exact(None, BR, RES), "w"),
    ("host_tail_exact branch of 3", lambda: EO.host_tail_exact(WTS, np.ones(3), RES), "branch"),
    ("tolerance_for truth of 3", lambda: EO.tolerance_for(WTS, BR, RES, np.ones(3)), "truth"),
    ("tolerance_for a NaN truth", lambda: EO.tolerance_for(WTS, BR, RES, np.full(32, NAN)), "truth"),
    # kernel tuning, the engine's test case
    ("rows_nt 16 (divided by zero)", lambda: KL.KernelTuning(rows_nt=16), "rows_nt"),
    ("rows_nt 0", lambda: KL.KernelTuning(rows_nt=0), "rows_nt"),
    ("rows_nt '256'", lambda: KL.KernelTuning(rows_nt="256"), "rows_nt"),
    ("wo_nt 33", lambda: KL.KernelTuning(wo_nt=33), "wo_nt"),
    ("wo_nt 4096", lambda: KL.KernelTuning(wo_nt=4096), "wo_nt"),
    ("down_nt 16", lambda: KL.KernelTuning(down_nt=16), "down_nt"),
    ("u_wo 0", lambda: KL.KernelTuning(u_wo=0), "u_wo"),
    ("wo_groups_per_sm -1", lambda: KL.KernelTuning(wo_groups_per_sm=-1), "wo_groups_per_sm"),
    ("sm_count 0", lambda: KL.KernelTuning(sm_count=0), "sm_count"),
    ("down_rows 3", lambda: KL.KernelTuning(down_rows=3), "down_rows"),
    ("down_rows 16", lambda: KL.KernelTuning(down_rows=16), "down_rows"),
    ("pre_wo 'yes'", lambda: KL.KernelTuning(pre_wo="yes"), "pre_wo"),
    ("lcg_stream n -1", lambda: FC.lcg_stream(-1, 1.0, 0), "n"),
    ("lcg_stream n 'a'", lambda: FC.lcg_stream("a", 1.0, 0), "n"),
    ("lcg_stream scale NaN", lambda: FC.lcg_stream(3, NAN, 0), "scale"),
    ("lcg_stream state -1", lambda: FC.lcg_stream(3, 1.0, -1), "state"),
    ("lcg_stream n 10**12", lambda: FC.lcg_stream(10**12, 1.0, 0), "n"),
]


@pytest.mark.parametrize("label, call, param", BAD, ids=[b[0] for b in BAD])
def test_a_bad_input_gets_an_error_naming_its_parameter(label, call, param):
    assert_clear(call, param)


#: What a user naturally passes, which must be taken (each returns something checked).
NATURAL: list[tuple[str, Callable[[], Any]]] = [
    ("numpy int as a block", lambda: hadamard.factor_block(np.int64(16)) == (1, 4)),
    ("signs as a list", lambda: HadamardFold(4, [1, -1, 1, 1]).signs.tolist() == [1, -1, 1, 1]),
    ("perm as a list", lambda: HadamardFold(4, None, [0, 2, 1, 3]).perm.tolist() == [0, 2, 1, 3]),
    ("signs as an MLX array", lambda: HadamardFold(4, mx.array([1, -1, 1, 1])).dim == 4),
    ("rotate a list", lambda: np.allclose(HadamardFold(4).rotate([1.0, 0, 0, 0]), 0.5)),
    ("a numpy width", lambda: HadamardFold(16).plan(np.int64(32)).width == 32),
    ("a list as a base", lambda: WeightMatrix([[1.0, 2.0], [3.0, 4.0]]).shape == (2, 2)),
    (
        "numpy bits",
        lambda: WeightMatrix.quantize(np.ones((8, 64), np.float32), bits=np.int64(4)).dtype == "affine4-g64",
    ),
    ("cfg.layer(np.int64(3))", lambda: BONSAI.layer(np.int64(3)).index == 3),
    ("refusals at a numpy layer", lambda: R.layer_refusals(BONSAI, np.int64(3)) == R.layer_refusals(BONSAI, 3)),
    (
        "host_tail of an MLX bfloat16 branch",
        lambda: T.host_tail(WTS, mx.array(BR).astype(mx.bfloat16), RES).shape == (32,),
    ),
    ("host_tail of lists", lambda: np.array_equal(T.host_tail(WTS, list(BR), list(RES)), T.host_tail(WTS, BR, RES))),
    ("fused_tail of lists", lambda: T.fused_tail(WTS, list(BR), list(RES), backend="graph").shape == (32,)),
    ("compare(tol=np.float32(1e-3))", lambda: C.compare(np.ones(3), np.ones(3), tol=np.float32(1e-3)).passed),
    ("compare an MLX array", lambda: C.compare(mx.ones(3), np.ones(3)).passed),
    (
        "three_way(tol=np.float32(1e-3))",
        lambda: "fused is right" in TW.three_way(WTS, BR, RES, tol=np.float32(1e-3)).verdict,
    ),
    (
        "case_weights eps np.float32",
        lambda: SC.case_weights((8, 8, 8), np.int64(0), eps=np.float32(1e-5))[0].eps == np.float32(1e-5),
    ),
    ("sweep eps np.float32", lambda: len(sweep1(eps=np.float32(1e-5))) == 2),
    ("a tuning of numpy ints", lambda: KL.KernelTuning(rows_nt=np.int64(128)).rows_nt == 128),
]


@pytest.mark.parametrize("label, call", NATURAL, ids=[n[0] for n in NATURAL])
def test_a_natural_input_is_taken(label, call):
    assert call() is True or call() == True  # noqa: E712 (numpy bools too)


# -- regressions ---------------------------------------------------------------------------


def test_quantizing_a_nan_weight_names_its_row_and_column():
    with pytest.raises(ValueError, match=r"^w: must be finite to quantize .* w\[3, 5\] = nan"):
        WeightMatrix.quantize(W_NAN)
    with pytest.raises(ValueError, match=r"w\[3, 5\] = nan"):  # folding first must not hide it
        WeightMatrix.quantize(W_NAN, fold=HadamardFold(64))


def test_a_value_beyond_float32_is_refused_at_its_place_and_float32s_own_are_kept():
    with pytest.raises(ValueError, match=r"^base: must fit float32 .* got 1e\+39 at index \(2, 3\) \(1 such"):
        WeightMatrix(F64_HUGE)
    # What float32 can hold is taken, its largest value included; an inf or NaN the caller
    # passed is theirs (a dense matrix keeps it and the tails propagate it), not an overflow.
    top = float(np.finfo(np.float32).max)
    assert WeightMatrix(np.full((2, 2), -top)).dense()[0, 0] == -np.float32(top)
    given = np.ones((2, 2))
    given[0, 1], given[1, 0] = INF, NAN
    dense = WeightMatrix(given).dense()
    assert dense[0, 1] == INF and np.isnan(dense[1, 0])


def test_an_empty_batch_rotates_in_mlx_as_in_numpy():
    # MLX's hadamard_transform refuses empty arrays in its own words; the numpy path answers
    # an empty batch with an empty batch, and so must MLX's, at every kind of block.
    for fold in (
        HadamardFold.random(48, 12, seed=0, permute=True),
        HadamardFold(16, [1, -1] * 8),
        HadamardFold.random(40, 20, seed=1, site=FoldSite.OUTPUT),
    ):
        for s in ((0, fold.dim), (2, 0, fold.dim)):
            for op in (fold.rotate, fold.unrotate):
                got = op(mx.zeros(s, dtype=mx.float32))
                mx.eval(got)
                want = op(np.zeros(s, np.float32))
                assert tuple(got.shape) == want.shape == s and got.dtype == mx.float32, (fold, s, op)
        assert tuple(hadamard.block_transform_mx(mx.zeros((0, 24)), 12, transpose=True).shape) == (0, 24)


@pytest.mark.parametrize("fmt", sorted(W.QUANT_FORMATS))
def test_the_quantization_error_of_a_zero_matrix_is_zero(fmt):
    # Every format stores 0 exactly, so the quantized map reproduces a zero matrix: its error
    # is 0 (the ratio would be 0/0, a NaN that reads as a failure in the study's table).
    q = W.QUANT_FORMATS[fmt].as_quantize()
    zero = np.zeros((8, 128), np.float32)  # 128 wide: one group of affine2's 128
    for fold in (None, HadamardFold(64)):
        assert W.quantization_error(zero, **q, fold=fold) == 0.0
    # ... and a matrix that is not zero still gets its relative error, positive and finite.
    w = W.outlier_matrix(8, 128, n_outliers=2, outlier_scale=20.0, seed=0)
    err = W.quantization_error(w, **q)
    assert 0 < err < 1


def test_same_rotation_compares_folds_and_none():
    f = HadamardFold.random(16, 16, seed=3)
    assert f.same_rotation(HadamardFold(16, f.signs)) and not f.same_rotation(None)
    assert not f.same_rotation(HadamardFold.random(16, 16, seed=4))


def test_one_sweep_case_allocates_about_one_case():
    shape = (512, 512, 2048)  # 13 MB a case; its block of 256 is 3.4 GB
    one_case = SC.case_floats(shape) * 4
    tracemalloc.start()
    try:
        w, br, res = SC.case_weights(shape, 0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert w.shape == shape
    assert peak < 8 * one_case, f"{peak / 2**20:.0f} MiB for a {one_case / 2**20:.0f} MiB case"


@pytest.mark.parametrize("shape", [(8, 8, 8), (12, 20, 28), (7, 5, 3)])
def test_drawing_some_rows_gives_the_bulk_draws_rows(shape):
    # An odd number of floats a case puts every other row mid-step of the stream.
    bulk = SC.draw_block(shape, 3)
    for rows in ([0], [1], [255], [2, 3, 100, 201]):
        part = SC.draw_block(shape, 3, rows)
        for name in SC.CaseArrays.__dataclass_fields__:
            assert np.array_equal(getattr(part, name), getattr(bulk, name)[rows]), (rows, name)


def test_a_sweeps_rows_match_its_single_cases():
    df = sweeps.sweep(shapes=[(16, 16, 32)], seeds=[5, 300, 301], progress=False)
    for seed, worst in zip(df["seed"], df["worst"]):
        w, br, res = SC.case_weights((16, 16, 32), int(seed))
        got = C.compare(T.fused_tail(w, br, res, backend="graph"), T.host_tail(w, br, res))
        assert got.worst == pytest.approx(worst, rel=1e-6, abs=1e-12)


@pytest.mark.parametrize(
    "make, param",
    [
        (lambda: qwen3(rms_norm_eps=-1), "rms_norm_eps"),
        (lambda: qwen3(rms_norm_eps=0), "rms_norm_eps"),
        (lambda: qwen3(rms_norm_eps=NAN), "rms_norm_eps"),
        (lambda: qwen3(num_hidden_layers=10**9), "num_hidden_layers"),
        (lambda: jamba(attn_layer_offset=4), "attn_layer_offset"),
        (lambda: qwen_next(mlp_only_layers=["3"]), "mlp_only_layers[0]"),
        (lambda: qwen_next(mlp_only_layers=[[3]]), "mlp_only_layers[0]"),
        (lambda: qwen_next(num_experts=-1), "num_experts"),
    ],
)
def test_the_config_defects_are_refused(make, param):
    assert_clear(lambda: cfg(make()), param)


def test_mlp_only_layers_as_ints_are_read():
    c = cfg(qwen_next(mlp_only_layers=[3]))
    assert c.layer(3).ffn_kind == "dense" and c.layer(1).ffn_kind == "experts"


def test_configs_and_folds_are_frozen_with_read_only_arrays():
    c = cfg(qwen3())
    with pytest.raises(TypeError):
        c.raw["hidden_size"] = 1  # a read-only mapping
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        c.rms_norm_eps = 2.0
    signs = np.array([1.0, -1.0, 1.0, 1.0])
    f = HadamardFold(4, signs)
    assert signs.flags.writeable and not f.signs.flags.writeable  # the caller's array stays theirs
    signs[0] = -1.0
    assert f.signs[0] == 1.0
    with pytest.raises(ValueError):
        f.signs[0] = -1.0
    plan = f.plan(4)
    assert not plan.signs.flags.writeable and not plan.perm.flags.writeable
    with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
        f.block = 8
    wm = WeightMatrix(np.ones((4, 4), np.float32))
    assert not wm.dense(np.float64).flags.writeable
    with pytest.raises(AttributeError):
        wm._fold = HadamardFold(4)


def test_the_three_tails_answer_an_empty_batch_alike():
    b, r = np.zeros((0, 32), np.float32), np.zeros((0, 32), np.float32)
    host = T.host_tail(WTS, b, r)
    assert host.shape == T.unfused_tail(WTS, b, r).shape == T.fused_tail(WTS, b, r, backend="graph").shape == (0, 32)
    b2, r2 = np.zeros((2, 0, 32), np.float32), np.zeros((2, 0, 32), np.float32)
    assert T.fused_tail(WTS, b2, r2, backend="graph").shape == (2, 0, 32)


def test_host_tail_reads_an_mlx_bfloat16_branch_as_fused_tail_does():
    b16 = mx.array(BR).astype(mx.bfloat16)
    exact = np.asarray(b16.astype(mx.float32))
    assert np.array_equal(T.host_tail(WTS, b16, RES), T.host_tail(WTS, exact, RES))
    assert C.compare(T.fused_tail(WTS, b16, RES, backend="graph"), T.host_tail(WTS, b16, RES)).passed


def test_three_way_names_a_non_finite_input():
    bad = BR.copy()
    bad[7] = NAN
    with pytest.raises(ValueError, match=r"^branch: must be finite .* nan at index \(7,\)"):
        TW.three_way(WTS, bad, RES)


def test_a_nan_scaled_error_gives_no_tolerance():
    with pytest.raises(ValueError, match="^f32_worst"):
        EO.oracle_tolerance(NAN)


# -- property tests --------------------------------------------------------------------------

BLOCKS = st.sampled_from([1, 2, 4, 8, 16, 12, 24, 20, 28])

#: Junk for any argument: what a careless caller passes.
JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([np.int64(-3), np.float32(NAN), np.bool_(True)]),
    st.lists(st.integers(-3, 3), max_size=4),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.just(object()),
    st.just(np.zeros((2, 0))),
    st.just(mx.array([1, 2])),
)


def _call_ok_or_clear(fn: Callable[..., Any], kwargs: dict) -> Any:
    """Run ``fn(**kwargs)``: a result, or a ValueError / BackendUnavailable; nothing else escapes."""
    try:
        return fn(**kwargs)
    except (ValueError, BackendUnavailable) as e:
        assert str(e), "an error with no message"
        return e


#: Public calls, with valid keyword arguments; each argument in turn is replaced with junk.
CALLS: list[tuple[str, Callable[..., Any], dict]] = [
    ("HadamardFold", lambda **k: HadamardFold(**k), dict(block=4, signs=[1, -1, 1, 1], perm=[3, 2, 1, 0])),
    ("HadamardFold.random", lambda **k: HadamardFold.random(**k), dict(dim=8, block=4, seed=0, permute=True)),
    ("block_transform", lambda **k: hadamard.block_transform(**k), dict(x=np.ones(8), block=4)),
    (
        "WeightMatrix.quantize",
        lambda **k: WeightMatrix.quantize(**k),
        dict(w=np.ones((4, 64), np.float32), mode="affine", bits=4, group_size=64),
    ),
    (
        "outlier_matrix",
        lambda **k: W.outlier_matrix(**k),
        dict(out_dim=4, in_dim=8, n_outliers=1, outlier_scale=3.0, seed=0),
    ),
    (
        "ModelConfig.synthetic",
        lambda **k: M.ModelConfig.synthetic(**k),
        dict(hidden=64, ffn_dim=32, num_q_heads=2, num_kv_heads=1, head_dim=16, rms_norm_eps=1e-6),
    ),
    ("refusals", lambda **k: R.layer_refusals(**k), dict(cfg=BONSAI, layer=3, kernels_enabled=True)),
    ("host_tail", lambda **k: T.host_tail(**k), dict(w=WTS, branch=BR, residual=RES, dtype=np.float64)),
    ("fused_tail", lambda **k: T.fused_tail(**k), dict(w=WTS, branch=BR, residual=RES, backend="graph")),
    ("unfused_tail", lambda **k: T.unfused_tail(**k), dict(w=WTS, branch=BR, residual=RES)),
    ("random_inputs", lambda **k: T.random_inputs(**k), dict(w=WTS, seed=0, batch=2)),
    ("compare", lambda **k: C.compare(**k), dict(actual=np.ones(3), expected=np.ones(3), tol=1e-3)),
    ("ulp_distance", lambda **k: C.ulp_distance(**k), dict(actual=np.ones(3), expected=np.ones(3), dtype="float32")),
    (
        "case_weights",
        lambda **k: SC.case_weights(**k),
        dict(shape=(8, 8, 8), seed=0, dtype="float32", fold=4, quantize=None, eps=1e-6, wo_outliers=1),
    ),
    (
        "sweep",
        lambda **k: sweeps.sweep(**k),
        dict(
            shapes=[(8, 8, 8)],
            seeds=[0, 1],
            dtypes=("float32",),
            folds=(4,),
            quantize=(None,),
            backends=("graph",),
            eps=1e-6,
            wo_outliers=0,
            progress=False,
        ),
    ),
    (
        "three_way",
        lambda **k: TW.three_way(**k),
        dict(w=WTS, branch=BR, residual=RES, tol=2e-4, backend="graph", fault=None),
    ),
    ("KernelTuning", lambda **k: KL.KernelTuning(**k), dict(rows_nt=256, u_wo=4, sm_count=132, pre_wo=True)),
    ("lcg_stream", lambda **k: FC.lcg_stream(**k), dict(n=3, scale=1.0, state=5)),
]


@pytest.mark.parametrize("name, fn, valid", CALLS, ids=[c[0] for c in CALLS])
@settings(max_examples=12, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_junk_in_any_argument_gives_a_result_or_a_clear_error(name, fn, valid, data):
    arg = data.draw(st.sampled_from(sorted(valid)), label="argument")
    junk = data.draw(JUNK, label="value")
    out = _call_ok_or_clear(fn, {**valid, arg: junk})
    if isinstance(out, ValueError) and not isinstance(out, BackendUnavailable):
        # The message names a parameter: the junk one, or one it made inconsistent
        # (signs/perm, actual/expected, or the array the junk shape did not fit).
        assert re.match(r"^[A-Za-z_][\w/\[\]]*:", str(out)), str(out)


@settings(max_examples=30)
@given(
    hidden=st.integers(1, 4096),
    layers=st.integers(1, 64),
    heads=st.sampled_from([1, 2, 4, 8]),
    eps=st.one_of(st.floats(1e-12, 1e-2), st.floats(allow_nan=True, allow_infinity=True)),
)
def test_configs_valid_or_clearly_refused(hidden, layers, heads, eps):
    d = qwen3(
        hidden_size=hidden * heads,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        rms_norm_eps=eps,
    )
    if math.isfinite(eps) and eps > 0:
        c = cfg(d)
        assert c.num_layers == layers and c.attention_layers() == list(range(layers))
        assert c.rms_norm_eps == eps and not R.layer_refusals(c, layers - 1)
    else:
        assert_clear(lambda: cfg(d), "rms_norm_eps")


@settings(max_examples=25)
@given(
    block=BLOCKS,
    nblocks=st.integers(1, 4),
    seed=st.integers(0, 2**32),
    permute=st.booleans(),
    site=st.sampled_from(list(FoldSite)),
    as_list=st.booleans(),
)
def test_a_fold_preserves_the_map(block, nblocks, seed, permute, site, as_list):
    dim = block * nblocks
    rnd = HadamardFold.random(dim, block, seed=seed, permute=permute, site=site)
    signs = rnd.signs.tolist() if as_list else rnd.signs
    perm = None if rnd.perm is None else (rnd.perm.tolist() if as_list else rnd.perm)
    f = HadamardFold(block, signs, perm, site)
    r = f.matrix()
    assert np.allclose(r @ r.T, np.eye(dim), atol=1e-12)
    w = np.random.default_rng(seed).standard_normal((dim, dim)).astype(np.float32)
    folded = WeightMatrix(w).fold_hadamard(f)
    assert np.allclose(folded.linear_map(), w, atol=1e-5)
    x = np.random.default_rng(seed + 1).standard_normal(dim)
    assert np.allclose(folded.apply(x), w.astype(np.float64) @ x, atol=1e-4)


@settings(max_examples=20)
@given(rows=st.integers(1, 6), seed=st.integers(0, 1000), r=st.data(), bad=st.sampled_from([NAN, INF, -INF]))
def test_quantize_refuses_any_non_finite_weight_at_its_place(rows, seed, r, bad):
    w = np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)
    i, j = r.draw(st.integers(0, rows - 1)), r.draw(st.integers(0, 63))
    w[i, j] = bad
    with pytest.raises(ValueError, match=rf"^w: must be finite to quantize.* w\[{i}, {j}\] = "):
        WeightMatrix.quantize(w)


@settings(max_examples=15)
@given(
    hidden=st.sampled_from([8, 16, 24]),
    branch=st.sampled_from([8, 16, 32]),
    ffn=st.sampled_from([8, 24, 64]),
    seed=st.integers(0, 10**6),
    fold=st.sampled_from([None, 4, 8]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    batch=st.sampled_from([(), (0,), (3,), (2, 2)]),
)
def test_the_tails_agree_with_the_float64_oracle(hidden, branch, ffn, seed, fold, dtype, batch):
    w = T.TailWeights.random(hidden, branch, ffn, seed=seed, fold_block=fold, dtype=dtype)
    br, res = T.random_inputs(w, seed=seed + 1, batch=batch)
    truth = T.host_tail(w, br, res)
    fused = T.fused_tail(w, br, res, backend="graph")
    unfused = T.unfused_tail(w, br, res)
    assert fused.shape == unfused.shape == truth.shape == batch + (hidden,)
    if 0 in batch:
        return
    # The calibrated tolerance: the float32 host's own error against the truth, doubled
    # and rounded up, never under frink-models' 2e-4 (exact_oracle.oracle_tolerance).
    f32_worst = max(
        C.compare(T.host_tail(w, b, r_, dtype=np.float32), T.host_tail(w, b, r_)).worst
        for b, r_ in zip(br.reshape(-1, branch), res.reshape(-1, hidden))
    )
    tol = EO.oracle_tolerance(f32_worst)
    assert np.isfinite(fused).all() and np.isfinite(unfused).all()
    assert C.compare(fused, truth, tol=tol).passed
    assert C.compare(unfused, truth, tol=tol).passed


@settings(max_examples=8)
@given(
    seeds=st.lists(st.integers(0, 2000), min_size=1, max_size=4),
    fold=st.sampled_from([None, 4]),
    quant=st.sampled_from([None, "affine8"]),
)
def test_a_sweep_is_finite_and_within_tolerance(seeds, fold, quant):
    shape = (16, 16, 64) if quant is None else (64, 64, 64)
    df = sweeps.sweep(shapes=[shape], seeds=seeds, folds=(fold,), quantize=(quant,), progress=False)
    assert sorted(df["seed"]) == sorted(set(seeds))
    assert np.isfinite(df["worst"]).all() and (df["worst"] <= 2e-4).all()


@settings(max_examples=30)
@given(
    x=st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=16),
    tol=st.one_of(st.floats(1e-9, 1.0), st.sampled_from([np.float32(1e-3), np.float64(2e-4), 1])),
)
def test_a_comparison_of_a_value_with_itself_passes(x, tol):
    c = C.compare(x, np.asarray(x), tol=tol)
    assert c.passed and c.worst == 0 and c.n == len(x)
    assert C.worst_scaled_error(x, x) == 0 and C.ulp_distance(x, x).max() == 0


@pytest.mark.skipif(
    {"metal", "cuda"} & set(available_backends()), reason="only where no kernel backend's device exists"
)
def test_an_absent_backend_raises_backend_unavailable():
    for name in ("metal", "cuda"):
        with pytest.raises(BackendUnavailable):
            T.fused_tail(WTS, BR, RES, backend=name)
        with pytest.raises(BackendUnavailable):
            sweep1(backends=(name,))


def test_the_figures_refuse_bad_input_clearly():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from workbench.reports import plots as P

    df = pd.DataFrame(
        {
            "worst": [1e-6, 2e-6],
            "dtype": ["float32", "float32"],
            "quant": ["none"] * 2,
            "fold": ["none"] * 2,
            "model_nmse": [1e-9, 2e-9],
        }
    )
    for call, param in [
        (lambda: P.plot_refusal_map(["bonsai"]), "cfgs[0]"),
        (lambda: P.plot_refusal_map([]), "cfgs"),
        (lambda: P.plot_refusal_map([BONSAI], kernels_enabled=None), "kernels_enabled"),
        (lambda: P.plot_rotation("fold"), "fold"),
        (lambda: P.plot_rotation(HadamardFold(16), 10**6), "dim"),
        (lambda: P.plot_quantization_study([1, 2]), "df"),
        (lambda: P.plot_error_histograms(df, metric="nope"), "metric"),
        (lambda: P.plot_error_histograms(df, by=3), "by"),
        (lambda: P.plot_error_histograms(df, bins=1), "bins"),
        (lambda: P.plot_error_histograms(df, tolerances={"a": NAN}), "tolerances['a']"),
        (lambda: P.plot_error_histograms(df.iloc[:0]), "df"),
        (lambda: P.plot_error_ecdf(df, flake_rate=2.0), "flake_rate"),
        (lambda: P.plot_error_ecdf(None), "df"),
        (lambda: P.plot_fold_effect(df[["worst", "model_nmse"]]), "df"),
        (lambda: P.plot_catch_rates(pd.DataFrame()), "rates"),
    ]:
        assert_clear(call, param)
    for fig in (
        P.plot_error_histograms(df, tolerances={"2e-4": np.float32(2e-4)}),
        P.plot_fold_effect(df),
        P.plot_rotation(HadamardFold(4, [1, -1, 1, 1])),
    ):
        plt.close(fig)


MODEL_NAMES = ML.list_models()


@settings(max_examples=60)
@given(name=st.sampled_from(MODEL_NAMES), data=st.data())
def test_junk_in_any_key_of_a_real_config_gives_a_config_or_a_clear_error(name, data):
    import json

    raw = json.loads((M.MODELS_DIR / f"{name}.json").read_text())
    scope = raw.get("text_config", raw) if data.draw(st.booleans(), label="nested") else raw
    key = data.draw(st.sampled_from(sorted(k for k in scope if not k.startswith("_"))), label="key")
    scope[key] = data.draw(
        JUNK.filter(
            lambda v: (
                not isinstance(v, (np.ndarray, mx.array, object().__class__))
                or isinstance(v, (int, float, str, list, dict, type(None)))
            )
        ),
        label="value",
    )
    try:
        c = MF.from_hf_config(raw, name=name)
    except ValueError as e:
        assert re.match(r"^[A-Za-z_][\w/\[\]]*:", str(e)), str(e)
        return
    # Taken: then it is a whole config the rules answer for, every layer.
    assert c.num_layers == len(c.layers) and c.rms_norm_eps > 0 and math.isfinite(c.rms_norm_eps)
    R.refusal_table(c)


CALLS_MORE: list[tuple[str, Callable[..., Any], dict]] = [
    (
        "WeightMatrix.apply",
        lambda **k: WeightMatrix(np.ones((4, 8), np.float32), HadamardFold(4, site=FoldSite.INPUT)).apply(**k),
        dict(x=np.ones(8)),
    ),
    ("HadamardFold.rotate", lambda **k: HadamardFold(4, [1, -1, 1, 1]).unrotate(**k), dict(y=np.ones((2, 4)))),
    ("case_arrays", lambda **k: SC.case_arrays(**k), dict(shape=(8, 8, 8), seeds=[3, 1, 3], wo_outliers=2)),
    (
        "mutation_sweep",
        lambda **k: sweeps.mutation_sweep(**k),
        dict(shapes=[(8, 8, 8)], seeds=[0], folds=(4,), mutations=("wrong_eps",), progress=False),
    ),
    (
        "three_way_table",
        lambda **k: TW.three_way_table(**k),
        dict(cases=[("a", WTS, BR, RES)], tol=2e-4, figures=False),
    ),
    ("tolerance_for", lambda **k: EO.tolerance_for(**k), dict(w=WTS, br=BR, res=RES, truth=T.host_tail(WTS, BR, RES))),
    (
        "quantization_error",
        lambda **k: W.quantization_error(**k),
        dict(w=np.ones((4, 64), np.float32), mode="affine", bits=8, group_size=64, fold=HadamardFold(16)),
    ),
    ("head_launch_refusals", lambda **k: R.head_launch_refusals(**k), dict(cfg=BONSAI, layer=3, q_kernel=True)),
    ("replace_layer", lambda **k: M.replace_layer(BONSAI, 3, **k), dict(ffn_dim=128, o_bias=True)),
    (
        "LayerConfig",
        lambda **k: M.LayerConfig(**k),
        dict(
            index=0,
            mixer=M.Mixer.ATTENTION,
            num_q_heads=4,
            num_kv_heads=2,
            head_dim=16,
            ffn_dim=64,
            ffn_kind="dense",
            ffn_act="swiglu",
            num_experts=0,
            pre_norm="rms",
        ),
    ),
    (
        "ModelConfig",
        lambda **k: M.ModelConfig(**k),
        dict(
            name="x",
            model_type="x",
            hidden_size=64,
            num_layers=1,
            rms_norm_eps=1e-6,
            layers=(M.LayerConfig(0, M.Mixer.MAMBA2),),
            residual_scale=0.5,
        ),
    ),
    ("WeightMatrix.dense", lambda **k: WTS.wo.dense(**k), dict(dtype=np.float32)),
    ("oracle_tolerance", lambda **k: EO.oracle_tolerance(**k), dict(f32_worst=1e-5)),
]


@pytest.mark.parametrize("name, fn, valid", CALLS_MORE, ids=[c[0] for c in CALLS_MORE])
@settings(max_examples=10, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_junk_in_more_arguments_gives_a_result_or_a_clear_error(name, fn, valid, data):
    test_junk_in_any_argument_gives_a_result_or_a_clear_error.hypothesis.inner_test(name, fn, valid, data)
