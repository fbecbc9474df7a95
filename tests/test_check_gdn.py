"""The recurrent step's check (``workbench.check.gdn_run`` and its modules): the batched
float64 step against the one-case oracle, correct steps written outside the workbench
judged correct, each fault model failing where it should, bad input as a verdict."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench.check import GDN_FAULTS, check_step, part
from workbench.check.gdn_cases import token_run
from workbench.check.gdn_faults import bfloat16_round, step_block
from workbench.kernels.gdn_step import GdnShape, recurrent_step_exact

SHAPE = GdnShape(2, 6, 32, 32, 4)
SMALL = {"geometries": [(2, 6, 32, 32, 4)], "seeds": range(6), "tokens": 16, "gates": ["typical"]}


def numpy_step(s):
    """A user's own float32 step from the formulas (not the workbench's code)."""
    hv, dv, dk = s.state.shape
    hk = s.k_heads
    window = np.concatenate([s.conv_state, s.mixed[None]])
    c = (window * s.conv_w).sum(0)
    c = c / (np.float32(1) + np.exp(-c))
    q, k, v = c[: hk * dk].reshape(hk, dk), c[hk * dk : 2 * hk * dk].reshape(hk, dk), c[2 * hk * dk :].reshape(hv, dv)
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + np.float32(1e-6)) / np.float32(np.sqrt(dk))
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + np.float32(1e-6))
    q, k = np.repeat(q, hv // hk, 0), np.repeat(k, hv // hk, 0)
    beta = np.float32(1) / (np.float32(1) + np.exp(-s.b))
    g = np.exp(-np.exp(s.a_log) * np.logaddexp(s.a + s.dt_bias, np.float32(0)))
    st = s.state * g[:, None, None]
    st = st + ((v - (st @ k[:, :, None])[..., 0]) * beta[:, None])[:, :, None] * k[:, None, :]
    o = (st @ q[:, :, None])[..., 0]
    o = o / np.sqrt((o * o).mean(-1, keepdims=True) + np.float32(s.eps)) * s.o_norm
    z = s.z.reshape(hv, dv)
    return (o * z / (np.float32(1) + np.exp(-z))).reshape(-1), window[1:], st.astype(np.float32)


def mlx_lm_step(delta: str):
    """The step around mlx-lm's recurrence (``gated_delta_ops`` or ``gated_delta_update``) or MLX's fast op."""
    from mlx_lm.models import gated_delta as gd

    def step(s):
        hv, dv, dk = s.state.shape
        hk = s.k_heads
        window = mx.concatenate([s.conv_state, s.mixed[None]])
        c = (window * s.conv_w).sum(0)
        c = c * mx.sigmoid(c)
        q = c[: hk * dk].reshape(1, 1, hk, dk)
        k = c[hk * dk : 2 * hk * dk].reshape(1, 1, hk, dk)
        v = c[2 * hk * dk :].reshape(1, 1, hv, dv)
        q = q * mx.rsqrt((q * q).sum(-1, keepdims=True) + 1e-6) * dk**-0.5
        k = k * mx.rsqrt((k * k).sum(-1, keepdims=True) + 1e-6)
        a, b = s.a.reshape(1, 1, hv), s.b.reshape(1, 1, hv)
        state = s.state[None]
        if delta == "update":
            o, st = gd.gated_delta_update(q, k, v, a, b, s.a_log, s.dt_bias, state)
        else:
            g, beta = gd.compute_g(s.a_log, a, s.dt_bias), mx.sigmoid(b)
            if delta == "ops":
                o, st = gd.gated_delta_ops(q, k, v, g, beta, state)
            else:
                o, st = mx.fast.gated_delta_update(q, k, v, g, beta, initial_state=state)
        o = mx.fast.rms_norm(o.reshape(hv, dv), s.o_norm, s.eps)
        z = s.z.reshape(hv, dv)
        return (o * z * mx.sigmoid(z)).reshape(-1), window[1:], st[0]

    return step


def test_float64_block_is_the_one_case_oracle():
    run = token_run(SHAPE, [3, 4], 3, scale=1.0, gate="typical", state_scale=1.0)
    w64 = run.weights.astype(np.float64)
    conv, st = run.conv_state.astype(np.float64), run.state.astype(np.float64)
    for t in range(3):
        x = [a[:, t].astype(np.float64) for a in (run.mixed, run.z, run.b, run.a)]
        o, conv2, st2 = step_block(w64, *x, conv, st)
        for i in range(2):
            ba = np.concatenate([x[2][i], x[3][i]])
            args = (x[0][i], x[1][i], ba, conv[i], w64.conv_w[i], w64.a_log[i], w64.dt_bias[i], w64.o_norm[i], st[i])
            eo, ec, es = recurrent_step_exact(*args, k_heads=2, eps=w64.eps)
            np.testing.assert_allclose(o[i], eo, rtol=1e-12, atol=1e-14)
            np.testing.assert_allclose(conv2[i], ec, rtol=0, atol=0)
            np.testing.assert_allclose(st2[i], es, rtol=1e-12, atol=1e-14)
        conv, st = conv2, st2


def test_bfloat16_round_is_mlx_s():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    want = np.array(mx.array(x).astype(mx.bfloat16).astype(mx.float32))
    np.testing.assert_array_equal(bfloat16_round(x), want)


@pytest.mark.parametrize("fn", [numpy_step, mlx_lm_step("ops"), mlx_lm_step("update"), mlx_lm_step("fast")])
def test_correct_steps_written_elsewhere_pass(fn):
    arrays = "numpy" if fn is numpy_step else "mlx"
    from workbench.check import CallableStep

    rep = check_step(CallableStep(fn, arrays=arrays), **{**SMALL, "scales": [0.01, 1.0]}, faults=())
    assert rep.passed, str(rep)
    assert not rep.problems


#: fault -> the condition it shows in (scale, gate, state scale) within 16 tokens.
WHERE = {
    "state_bfloat16": (1.0, "near_one", 1.0),
    "beta_bfloat16": (1.0, "typical", 1.0),
    "decay_after_update": (1.0, "typical", 1.0),
    "scale_missing": (1.0, "typical", 0.0),
    "l2_eps_outside_root": (0.001, "typical", 1.0),
    "key_head_modulo": (1.0, "typical", 1.0),
    "conv_not_shifted": (1.0, "typical", 1.0),
    "softplus_dropped": (1.0, "typical", 1.0),
}


def test_every_fault_model_is_caught_where_it_shows():
    assert set(WHERE) == set(GDN_FAULTS)
    for f, (scale, gate, st) in WHERE.items():
        rep = check_step(
            None,
            geometries=[(2, 6, 32, 32, 4)],
            seeds=range(8),
            tokens=16,
            scales=[scale],
            gates=[gate],
            state_scales=[st],
            faults=[f],
        )
        share = rep.catch_table().loc[(f, 16), "4x reference"]
        assert share == 1.0, (f, share)


def test_the_bfloat16_state_as_a_user_step_fails():
    def bf16_state(s):
        o, c, st = numpy_step(s)
        return o, c, bfloat16_round(st)

    rep = check_step(bf16_state, **SMALL, faults=())
    assert not rep.passed
    assert "not those of a correct float32 step" in rep.reasons[0]


def test_head_ratio_one_cannot_show_the_key_head_mapping():
    rep = check_step(None, **{**SMALL, "geometries": [(2, 2, 32, 32, 4)]}, faults=["key_head_modulo"])
    assert rep.catch_table().loc[("key_head_modulo", 16), "4x reference"] == 0.0


def test_bad_returns_are_verdicts_naming_part_case_token_tensor():
    def wrong_dtype(s):
        o, c, st = numpy_step(s)
        return o, c, (st.astype(np.float16) if s.token == 2 else st)

    def wrong_shape(s):
        o, c, st = numpy_step(s)
        return o, c, st[:, :, :-1]

    for fn, tensor, token, what in ((wrong_dtype, "state", 3, "dtype float16"), (wrong_shape, "state", 1, "shape")):
        rep = check_step(fn, **SMALL, faults=())
        assert not rep.passed
        first = rep.problems[0]
        assert first.startswith("part gdn, case geometry 2/6/32/32/4"), first
        assert f"token {token}: tensor {tensor}: returned {what}" in first, first
        assert len(rep.problems) == 6 * 4  # one a run (6 seeds, 4 conditions), each stopped at its first bad token


def test_a_callable_that_raises_is_reported_not_raised():
    def boom(s):
        raise RuntimeError("kaboom")

    rep = check_step(boom, **SMALL, faults=())
    assert "raised RuntimeError: kaboom" in rep.problems[0]


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="gates"):
        check_step(numpy_step, gates=["slow"])
    with pytest.raises(ValueError, match="geometries: Hv must be a multiple"):
        check_step(numpy_step, geometries=[(3, 4, 32, 32, 4)])
    with pytest.raises(ValueError, match="faults"):
        check_step(numpy_step, faults=["nope"])
    with pytest.raises(ValueError, match="part"):
        part("attention")


def test_parts_share_one_shape():
    tail, gdn = part("tail"), part("gdn")
    assert tail.check.__name__ == "check_kernel" and gdn.check is check_step
    assert set(gdn.faults) == set(GDN_FAULTS)
    assert {"scales", "gates", "state_scales", "geometries"} <= set(gdn.axes)


def test_report_tables_and_record():
    rep = check_step(numpy_step, **SMALL, faults=["state_bfloat16"], horizons=[1, 4])
    assert rep.horizons == [1, 4, 16]
    assert list(rep.error_table().index) == [1, 4, 16]
    fc = rep.first_caught()
    assert fc.loc["state_bfloat16", "4x reference"] == 1
    out_only = rep.first_caught("out")
    assert out_only.loc["state_bfloat16", "4x reference"] > 1  # the output alone shows it later
    rec = rep.to_record()
    assert rec["part"] == "gdn" and rec["passed"]
    assert "growth" in rec and len(rec["catch_rates"]) == 2 * 3
    assert "PASS: part gdn" in str(rep)


def test_the_report_reads_as_the_tails():
    from workbench.check.report import REFERENCE_ROW

    many = {**SMALL, "seeds": range(25), "tokens": 4}  # 100 runs: enough errors to calibrate on
    rep = check_step(numpy_step, **many, faults=["state_bfloat16"], horizons=[1])
    table = rep.catch_table()
    # the reference row is the workbench's float32 reference, not the subject's runs
    assert list(table.index.get_level_values(0).unique()) == [REFERENCE_ROW, "state_bfloat16"]
    ref = rep.curves["ref_worst"]
    for h in rep.horizons:
        assert table.loc[(REFERENCE_ROW, h), "frink-models 2e-4"] == np.mean(~(ref[:, :h].max(axis=1) <= 2e-4))
        assert table.loc[(REFERENCE_ROW, h), "4x reference"] == 0.0
    # the calibrated tolerance: fitted to the passing subject's own errors, said so with its flake rate
    assert rep.calibrated_on == "numpy_step's own errors (its verdict passes)"
    text = str(rep)
    assert "calibrated tolerance: worst <= " in text and "at flake rate 0.001 a run, fitted to numpy_step's own" in text
    assert "q50 .. q100" in text and "a tolerance's flake rate (what it costs a correct step)" in text
    assert rep.to_record()["calibrated_on"] == rep.calibrated_on
    # a failing subject: fitted to the reference's errors; its own failures in subject_table
    bad = check_step(_bf16_state_step, **many, faults=(), horizons=[1])
    assert not bad.passed and bad.calibrated_on.startswith("the workbench's float32 reference's errors")
    assert bad.subject_table().loc[1, "4x reference"] >= 0.95
    with pytest.raises(ValueError, match="metric"):
        bad.subject_table("state")


def _bf16_state_step(s):
    out, conv, state = numpy_step(s)
    return out, conv, bfloat16_round(state)


#: A Metal step of the test's own: one thread a value head, everything serial in it.
METAL_HEADER = """
inline float conv_silu(const device float* mixed, const device float* cs, const device float* w,
                       uint ch, uint K, uint C) {
    float acc = mixed[ch] * w[(K - 1) * C + ch];
    for (uint t = 0; t + 1 < K; ++t) acc += cs[t * C + ch] * w[t * C + ch];
    return acc / (1.0f + metal::exp(-acc));
}
"""
METAL_BODY = """
    uint h = thread_position_in_grid.x;
    if (h >= HV) return;
    uint kh = h / (HV / HK);
    float q[DK], k[DK], v[DV], o[DV];
    float qs = 0.0f, ks = 0.0f;
    for (uint j = 0; j < DK; ++j) {
        q[j] = conv_silu(mixed, conv_state, conv_w, kh * DK + j, K, C);
        k[j] = conv_silu(mixed, conv_state, conv_w, HK * DK + kh * DK + j, K, C);
        qs += q[j] * q[j];
        ks += k[j] * k[j];
    }
    float qn = metal::rsqrt(qs + 1e-6f) / metal::sqrt(float(DK)), kn = metal::rsqrt(ks + 1e-6f);
    for (uint j = 0; j < DK; ++j) { q[j] *= qn; k[j] *= kn; }
    for (uint i = 0; i < DV; ++i) v[i] = conv_silu(mixed, conv_state, conv_w, 2 * HK * DK + h * DV + i, K, C);
    float beta = 1.0f / (1.0f + metal::exp(-b[h]));
    float x = a[h] + dt_bias[h];
    float sp = metal::max(x, 0.0f) + metal::log(1.0f + metal::exp(-metal::abs(x)));
    float g = metal::exp(-metal::exp(a_log[h]) * sp);
    float ms = 0.0f;
    for (uint i = 0; i < DV; ++i) {
        uint base = (h * DV + i) * DK;
        float sk = 0.0f;
        for (uint j = 0; j < DK; ++j) sk += g * state[base + j] * k[j];
        float d = (v[i] - sk) * beta, oq = 0.0f;
        for (uint j = 0; j < DK; ++j) {
            float s = g * state[base + j] + d * k[j];
            state_out[base + j] = s;
            oq += s * q[j];
        }
        o[i] = oq;
        ms += oq * oq;
    }
    float r = metal::rsqrt(ms / float(DV) + eps[0]);
    for (uint i = 0; i < DV; ++i) {
        float zz = z[h * DV + i];
        out[h * DV + i] = o[i] * r * o_norm[i] * zz / (1.0f + metal::exp(-zz));
    }
    for (uint ch = h; ch < C; ch += HV)
        for (uint t = 0; t + 1 < K; ++t)
            conv_state_out[t * C + ch] = t + 2 < K ? conv_state[(t + 1) * C + ch] : mixed[ch];
"""


def _metal(body: str = METAL_BODY):
    from workbench.check import StepSource

    tpl = {"HK": "HK", "HV": "HV", "DK": "DK", "DV": "DV", "K": "K", "C": "C"}
    return StepSource(body, grid=(6, 1, 1), threadgroup=(6, 1, 1), template=tpl, header=METAL_HEADER)


TINY = {**SMALL, "seeds": range(2), "tokens": 4, "scales": [1.0], "state_scales": [1.0], "faults": ()}


def test_a_metal_step_of_ones_own_passes_on_the_emulator():
    pytest.importorskip("workbench.kernels.metal_emulation")
    rep = check_step(_metal(), **TINY)
    assert not rep.problems, rep.problems
    assert rep.passed, str(rep)


def test_the_workbench_kernels_folder_passes_and_a_broken_body_is_named(tmp_path):
    import shutil

    from workbench.check import KernelsFolderStep
    from workbench.files import PROJECT_ROOT

    folder = tmp_path / "kernels"
    shutil.copytree(PROJECT_ROOT / "kernels", folder)
    rep = check_step(KernelsFolderStep(folder), **TINY)
    assert rep.passed, str(rep)
    broken = tmp_path / "broken"  # a folder of its own: the kernels' door keeps a folder's compiled kernel
    shutil.copytree(folder, broken)
    body = broken / "gdn_step.body"
    body.write_text(body.read_text() + "\n this is not Metal \n")
    rep = check_step(KernelsFolderStep(broken), **TINY)
    assert not rep.passed and "token 1" in rep.problems[0]
