"""A Metal tail source of this test's own, checked on the CPU emulator; the CUDA source form
runs on an NVIDIA GPU only and skips here naming why."""

import pytest

from workbench import backends
from workbench.check import SourceLaunch, SourceSubject, check_kernel

TAIL_SOURCE = """
uint t = thread_position_in_threadgroup.x;
threadgroup float h[HIDDEN];
threadgroup float act[FFN];
threadgroup float part[THREADS];
for (uint i = t; i < HIDDEN; i += THREADS) {
  float s = 0.0f;
  for (uint j = 0; j < BRANCH; ++j) s += float(wo[i * BRANCH + j]) * branch[j];
  h[i] = residual[i] + s;
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
float ss = 0.0f;
for (uint i = t; i < HIDDEN; i += THREADS) ss += h[i] * h[i];
part[t] = ss;
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
float total = 0.0f;
for (uint k = 0; k < THREADS; ++k) total += part[k];
float inv = metal::rsqrt(total / float(HIDDEN) + eps[0]);
for (uint f = t; f < FFN; f += THREADS) {
  float g = 0.0f, u = 0.0f;
  for (uint i = 0; i < HIDDEN; ++i) {
    float x = h[i] * inv * ffn_norm[i];
    g += float(gate[f * HIDDEN + i]) * x;
    u += float(up[f * HIDDEN + i]) * x;
  }
  act[f] = g / (1.0f + metal::exp(-g)) * u;
}
threadgroup_barrier(metal::mem_flags::mem_threadgroup);
for (uint i = t; i < HIDDEN; i += THREADS) {
  float s = 0.0f;
  for (uint f = 0; f < FFN; ++f) s += float(down[i * FFN + f]) * act[f];
  out[i] = h[i] + s;
}
"""

LAUNCH = SourceLaunch(
    TAIL_SOURCE,
    ("branch", "residual", "wo", "ffn_norm", "gate", "up", "down", "eps"),
    grid=(32, 1, 1),
    threadgroup=(32, 1, 1),
    template={"HIDDEN": "hidden", "BRANCH": "branch", "FFN": "ffn", "THREADS": 32},
    name="test_tail",
)


def test_a_correct_metal_source_on_the_emulator_is_judged_correct(emulator):
    rep = check_kernel(SourceSubject(LAUNCH), seeds=range(40), folds=(None,), faults=())
    assert not rep.problems, rep.problems[:3]
    assert rep.passed, str(rep)


def test_a_dropped_barrier_is_caught(emulator):
    # The first barrier guards nothing here (each thread reads back only the rows it wrote
    # before the second), so dropping it changes no result; the second guards part[].
    bar = "threadgroup_barrier(metal::mem_flags::mem_threadgroup);"
    first = TAIL_SOURCE.index(bar)
    second = TAIL_SOURCE.index(bar, first + 1)
    for cut, changes in ((first, False), (second, True)):
        broken = LAUNCH.with_source(TAIL_SOURCE[:cut] + TAIL_SOURCE[cut + len(bar) :], name=f"no_barrier_{cut}")
        rep = check_kernel(SourceSubject(broken, order="descending"), seeds=range(40), folds=(None,), faults=())
        assert rep.passed is not changes, str(rep)


def test_bad_launch_input_names_are_refused():
    with pytest.raises(ValueError, match="inputs"):
        SourceLaunch(TAIL_SOURCE, ("branch", "nonsense"))


@pytest.mark.cuda
def test_a_cuda_source_runs_on_an_nvidia_gpu():
    """On an NVIDIA GPU: the same tail in CUDA through mx.fast.cuda_kernel, judged correct."""
    try:
        backends.resolve_backend("cuda")
    except backends.BackendUnavailable as e:
        pytest.skip(f"cuda: {e}")
    # Metal's `uint` is no CUDA type: NVRTC compiles without the system headers that define it
    src = (
        TAIL_SOURCE.replace("uint ", "unsigned int ")
        .replace("thread_position_in_threadgroup.x", "threadIdx.x")
        .replace("threadgroup float", "__shared__ float")
        .replace("threadgroup_barrier(metal::mem_flags::mem_threadgroup);", "__syncthreads();")
        .replace("metal::rsqrt", "rsqrtf")
        .replace("metal::exp", "expf")
    )
    launch = SourceLaunch(
        src,
        LAUNCH.inputs,
        grid=(32, 1, 1),
        threadgroup=(32, 1, 1),
        template=dict(LAUNCH.template),
        name="test_tail_cuda",
    )
    rep = check_kernel(
        SourceSubject(launch, language="cuda", run_on="device"), seeds=range(40), folds=(None,), faults=()
    )
    assert rep.passed, str(rep)


def test_the_cuda_form_says_why_it_cannot_run_here():
    if "cuda" in backends.available_backends():
        pytest.skip("an NVIDIA GPU is present: the CUDA form runs (test above)")
    with pytest.raises(backends.BackendUnavailable):
        SourceSubject(LAUNCH, language="cuda", run_on="device")
