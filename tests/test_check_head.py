"""The attention head as a part of the check (``workbench.check.head_*``): its float64 truth
against mlx-lm's own modules, its faults caught where they should be, and bad input named."""

from __future__ import annotations

import numpy as np
import pytest

from tests.check_user_heads import METAL_BODY, METAL_INPUTS, METAL_INTERLEAVED, METAL_TEMPLATE, mlx_lm_head, numpy_head
from workbench.check import (
    DEFAULT_HEAD_SPECS,
    HEAD_FAULTS,
    CallableHead,
    HeadSource,
    HeadSpec,
    KernelsFolderHead,
    check_head,
    head_exact,
    part,
)
from workbench.check.head_cases import draw_head_cases
from workbench.check.head_math import applies


def test_mlx_lm_qwen35_attention_head_judged_correct_at_several_positions():
    spec = DEFAULT_HEAD_SPECS["model"]
    rep = check_head(
        CallableHead(mlx_lm_head(spec), arrays="mlx"),
        specs=[spec],
        seeds=range(12),
        positions=(0, 1, 100, 4095),
        faults=(),
    )
    assert rep.passed, str(rep)
    assert sorted({c["position"] for c in rep.conditions}) == [0, 1, 100, 4095]
    # its errors are those of float32 arithmetic against the float64 truth
    assert np.nanmax(rep.errors["subject"]) < 1e-4


def test_truth_is_float64_and_the_reference_and_numpy_float32_agree_with_it():
    for spec in DEFAULT_HEAD_SPECS.values():
        cases = draw_head_cases(spec, range(4), scale=1.0)
        one = cases.weights.case(2)
        exact = head_exact(spec, one, cases.hidden[2], position=7)
        assert all(v.dtype == np.float64 for v in exact.values()) and tuple(exact) == spec.outputs
        rep = check_head(numpy_head(), specs=[spec], seeds=range(8), positions=(7,), faults=())
        assert rep.passed and np.nanmax(rep.errors["reference"]) < 1e-5


def test_part_head_is_registered_with_its_pieces():
    p = part("head")
    assert p.name == "head" and p.oracle is head_exact and p.faults is HEAD_FAULTS
    assert set(p.axes) == {"specs", "scales", "positions"}


@pytest.mark.parametrize("fault", list(HEAD_FAULTS))
def test_each_fault_fails_where_it_should(fault):
    specs = [s for s in DEFAULT_HEAD_SPECS.values() if applies(fault, s)]
    rep = check_head(numpy_head(fault), specs=specs, seeds=range(12), faults=())
    assert not rep.passed
    failing = {(c["scale"], c["position"]) for t, c in zip(rep.tests, rep.conditions) if t.rejected}
    if fault == "eps_outside_root":  # eps shows only where mean x^2 is near it
        assert {s for s, _ in failing} == {1e-3}
    elif fault in ("rope_halves_swapped", "rope_interleaved", "rope_full_width"):  # RoPE is the identity at 0
        assert failing and all(p > 0 for _, p in failing)
        assert len(failing) == len(rep.conditions) - 2
    else:
        assert len(failing) == len(rep.conditions)


def test_a_wrong_return_is_named_by_part_case_and_tensor():
    def short_k(h):
        q, k, v, g = numpy_head()(h)
        return q, k[:-1], v, g

    rep = check_head(short_k, seeds=range(3), positions=(0,), faults=())
    assert not rep.passed
    assert rep.problems[0].startswith("part head, case qwen3.5-like") and "tensor k: returned shape" in rep.problems[0]


@pytest.mark.parametrize(
    ("kw", "named"),
    [
        ({"specs": ["nope"]}, "specs"),
        ({"positions": [-1]}, "positions"),
        ({"scales": [0]}, "scales"),
        ({"faults": ["rope_sideways"]}, "faults"),
    ],
)
def test_bad_arguments_are_named(kw, named):
    with pytest.raises(ValueError, match=rf"^{named}: "):
        check_head(numpy_head(), **kw)


def test_a_spec_refuses_what_its_shape_cannot_have():
    with pytest.raises(ValueError, match="^shape: the 'launch' head has no QK-norm"):
        HeadSpec("launch", 64, 4, 2, 16, qk_norm=True)
    with pytest.raises(ValueError, match="^rotary_dim: must be even"):
        HeadSpec("model", 64, 4, 2, 16, rotary_dim=5)


def _source(body=METAL_BODY):
    return HeadSource(
        body, METAL_INPUTS, grid=(6, 1, 1), threadgroup=(6, 1, 1), template=METAL_TEMPLATE, name="my_head"
    )


def test_a_metal_head_on_the_emulator_passes_and_its_interleaved_rope_fails_past_position_0(emulator):
    rep = check_head(_source(), seeds=range(8), positions=(0, 4095), faults=())
    assert rep.passed, str(rep)
    bad = check_head(_source(METAL_INTERLEAVED), seeds=range(8), positions=(0, 4095), faults=())
    assert [c["position"] for t, c in zip(bad.tests, bad.conditions) if t.rejected] == [4095, 4095]
    assert "worst tensor: q" in bad.reasons[0] or "worst tensor: k" in bad.reasons[0]


def test_the_workbench_head_launch_as_a_kernels_folder(tmp_path, emulator):
    import shutil

    from workbench.files import PROJECT_ROOT

    folder = tmp_path / "k"
    shutil.copytree(PROJECT_ROOT / "kernels", folder)
    rep = check_head(KernelsFolderHead(folder), specs=["launch"], seeds=range(8))
    assert rep.passed, str(rep)
    assert rep.caught_where()["fold_q_only"] and rep.caught_where()["bias_dropped"]
    # the launch computes the launch shape only: a model head is every case's problem, named
    refused = check_head(KernelsFolderHead(folder), specs=["model"], seeds=range(2), positions=(0,), faults=())
    assert not refused.passed and "the 'launch' shape" in refused.problems[0]


def test_mutants_of_a_metal_head_are_caught_or_named_equivalent(emulator):
    from workbench.check.head_mutants import head_mutant_study

    study = head_mutant_study(_source(), seeds=range(4), scales=(1e-3, 1.0), positions=(0, 100))
    c = study.counts()
    assert study.original_passed and study.original_same_bits and len(study.table) >= 6
    assert c["missed"] == 0, str(study)
    assert c["caught"] >= 4


@pytest.mark.cuda
def test_a_cuda_head_runs_on_an_nvidia_gpu():
    """On an NVIDIA GPU: the same head in CUDA through mx.fast.cuda_kernel, judged correct."""
    from tests.check_user_heads import CUDA_BODY
    from workbench import backends

    try:
        backends.resolve_backend("cuda")
    except backends.BackendUnavailable as e:
        pytest.skip(f"cuda: {e}")
    src = HeadSource(
        CUDA_BODY,
        METAL_INPUTS,
        grid=(6, 1, 1),
        threadgroup=(6, 1, 1),
        template=METAL_TEMPLATE,
        language="cuda",
        run_on="device",
        name="my_cuda_head",
    )
    rep = check_head(src, seeds=range(12), faults=())
    assert rep.passed, str(rep)


def test_the_cuda_form_says_why_it_cannot_run_here():
    from tests.check_user_heads import CUDA_BODY
    from workbench import backends

    if "cuda" in backends.available_backends():
        pytest.skip("an NVIDIA GPU is present: the CUDA form runs (test above)")
    with pytest.raises(backends.BackendUnavailable):
        HeadSource(CUDA_BODY, METAL_INPUTS, language="cuda", run_on="device")


def test_a_head_handed_torch_tensors():
    torch = pytest.importorskip("torch")

    def torch_head(h):
        assert isinstance(h.q_w, torch.Tensor)
        return numpy_head()(
            h.__class__(*(v.numpy() if isinstance(v, torch.Tensor) else v for v in h.__dict__.values()))
        )

    rep = check_head(CallableHead(torch_head, arrays="torch"), seeds=range(4), positions=(1,), faults=())
    assert rep.passed, str(rep)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (
            lambda out: (out[0], out[1].astype("float16"), *out[2:]),
            "tensor k: returned dtype float16, expected float32",
        ),
        (lambda out: (out[0], out[1], out[2] * float("nan"), out[3]), "tensor v: not finite (NaN or inf)"),
        (lambda out: out[:3], "expected (q, k, v, gate)"),
        (lambda out: (out[0].tolist(), *out[1:]), "tensor q: returned list"),
    ],
)
def test_what_a_head_returns_wrong_is_named_by_part_case_and_tensor(change, said):
    rep = check_head(lambda h: change(numpy_head()(h)), seeds=range(2), scales=(1.0,), positions=(0,), faults=())
    assert not rep.passed and rep.problems[0].startswith("part head, case ") and said in rep.problems[0]


def test_a_metal_head_of_the_launch_shape_reads_the_shared_rotation(emulator):
    from tests.check_user_heads import METAL_LAUNCH_BODY, METAL_LAUNCH_INPUTS

    rows = 4 * 16 + 2 * 2 * 16
    tpl = {"HID": "HID", "QR": "QR", "HKV": "HKV", "D": "D"}
    src = HeadSource(METAL_LAUNCH_BODY, METAL_LAUNCH_INPUTS, grid=(rows, 1, 1), threadgroup=(32, 1, 1), template=tpl)
    rep = check_head(src, specs=["launch"], seeds=range(8), faults=())
    assert rep.passed, str(rep)
    unrotated = src.with_source(METAL_LAUNCH_BODY.replace("rotation[j * HID + i]", "(i == j ? 1.0f : 0.0f)"))
    assert not check_head(unrotated, specs=["launch"], seeds=range(8), faults=()).passed


def test_mutants_of_the_head_launchs_body_in_a_kernels_folder(tmp_path, emulator):
    """The workbench's own head_qkv.body, mutated in a copy of the folder: the row loop's bound
    moved either way is caught; the prefetch guard's (PRE, off in the default tuning) changes no bit."""
    import shutil

    from workbench.check.head_mutants import head_mutant_study
    from workbench.files import PROJECT_ROOT

    shutil.copytree(PROJECT_ROOT / "kernels", tmp_path / "k")
    before = (tmp_path / "k" / "head_qkv.body").read_text()
    study = head_mutant_study(KernelsFolderHead(tmp_path / "k"), specs=["launch"], seeds=range(4))
    assert study.original_passed and study.counts()["missed"] == 0 and study.counts()["caught"] >= 2
    assert set(study.table.loc[study.table["status"] == "equivalent", "before"].str.contains("PRE")) <= {True}
    assert (tmp_path / "k" / "head_qkv.body").read_text() == before  # the user's folder is only read
