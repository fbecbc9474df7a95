"""Backends: what is here, 'auto', a clear error for what is not, and how fused_tail reaches a kernel."""

from __future__ import annotations

import os

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends as B
from workbench import tail as T
from workbench.kernels import emulated as KE
from workbench.kernels import launch as KL
from workbench.kernels import run as KR
from workbench.kernels import source as ks
from workbench.tail.frink_case import seed_case


def test_graph_is_always_available():
    assert "graph" in B.available_backends()
    assert B.auto_backends()[-1] == "graph"  # the last "auto" may pick
    assert [b for b in B.available_backends() if b != "metal-emulated"] == B.auto_backends()
    assert B.resolve_backend("graph") == "graph"


def test_available_backends_tell_the_truth(monkeypatch):
    """Every backend listed resolves, every one left out raises: the list is what
    ``resolve_backend`` would answer, the emulator included where clang++ is here."""
    for name in ("graph", "metal", "cuda", "metal-emulated"):
        if name in B.available_backends():
            assert B.resolve_backend(name) == name
        else:
            with pytest.raises(B.BackendUnavailable):
                B.resolve_backend(name)
    monkeypatch.setattr(B, "clang", lambda: "/usr/bin/clang++")
    assert B.available_backends()[-1] == "metal-emulated" and "metal-emulated" not in B.auto_backends()
    monkeypatch.setattr(B, "clang", lambda: None)
    assert "metal-emulated" not in B.available_backends()


@pytest.mark.skipif(B.metal_available() or B.cuda_available(), reason="a GPU is here")
def test_auto_on_a_cpu_is_the_graph():
    assert B.auto_backends() == ["graph"]
    assert B.available_backends() == ["graph"] + (["metal-emulated"] if B.clang_available() else [])
    assert B.resolve_backend("auto") == "graph"


@pytest.mark.skipif(B.metal_available(), reason="Metal is here")
def test_metal_absent_says_so():
    with pytest.raises(B.BackendUnavailable, match=r"Apple GPU.*mx.metal.is_available\(\) is False"):
        B.resolve_backend("metal")


@pytest.mark.skipif(B.cuda_available(), reason="CUDA is here")
def test_cuda_absent_says_so():
    with pytest.raises(B.BackendUnavailable, match=r"NVIDIA GPU.*mlx\[cuda13\]"):
        B.resolve_backend("cuda")


def test_a_kernel_backend_is_available_exactly_when_its_device_is(monkeypatch):
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    monkeypatch.setattr(B, "metal_available", lambda: False)
    monkeypatch.setattr(B, "clang", lambda: None)
    assert B.available_backends() == ["cuda", "graph"]
    assert B.resolve_backend("cuda") == "cuda"
    with pytest.raises(B.BackendUnavailable, match="backend 'metal'"):
        B.resolve_backend("metal")


@pytest.mark.parametrize("dialect,runner", [("cuda", (KR, "run_cuda_tail")), ("metal", (KR, "run_kernel_tail"))])
def test_fused_tail_runs_a_kernel_backend_through_the_one_launch_builder(monkeypatch, dialect, runner):
    """auto picks the kernel backend that is here; CUDA runs the tail as one launch
    (workbench.kernels.one_launch), Metal its three launches; both get the one builder's TailLaunch."""
    monkeypatch.setattr(B, "cuda_available", lambda: dialect == "cuda")
    monkeypatch.setattr(B, "metal_available", lambda: dialect == "metal")
    seen = {}

    def fake(*args):
        launch, residual = args[-3], args[-1]
        seen["args"], seen["launch"] = args, launch
        return np.zeros(np.shape(residual), np.float32)

    monkeypatch.setattr(*runner, fake)
    c = seed_case()
    out, name = T.fused_tail(c.weights, c.branch, c.residual, return_backend=True)
    assert name == dialect and out.shape == (64,)
    assert len(seen["args"]) == (3 if dialect == "cuda" else 4)  # run_kernel_tail also takes the dialect
    assert isinstance(seen["launch"], T.TailLaunch)  # the one builder assembled it


def test_the_kernel_backends_are_the_source_dialects():
    # "metal-emulated" runs the Metal dialect's kernels on the CPU: a backend, not a dialect.
    assert set(KL.KERNEL_BACKENDS) == set(B.BACKENDS) - {"auto", "graph", KE.METAL_EMULATED}
    assert KL.KERNEL_BACKENDS == ks.DIALECTS


def test_backend_unavailable_is_a_runtime_error():
    assert issubclass(B.BackendUnavailable, RuntimeError)


def test_bad_names():
    with pytest.raises(ValueError, match="backend must be one of"):
        B.resolve_backend("opencl")
    with pytest.raises(ValueError, match=r"dialect must be one of \('metal', 'cuda', 'metal-emulated'\).*got 'graph'"):
        KR.run_kernel_tail("graph", None, None, None)


@pytest.mark.skipif(B.cuda_available(), reason="CUDA is here")
def test_a_kernel_asked_for_without_its_device_says_so():
    launch = T.tail_launch(seed_case().weights)
    with pytest.raises(B.BackendUnavailable, match="backend 'cuda' needs an NVIDIA GPU"):
        KR.run_kernel_tail("cuda", launch, np.zeros(96, np.float32), np.zeros(64, np.float32))


def test_device_description_names_mlx():
    d = B.device_description()
    assert d["mlx_version"] and d["mlx_device"].startswith("Device(")


def test_device_kind_names_the_backend_of_a_device():
    assert B.device_kind(mx.Device(mx.cpu)) == "cpu"
    assert B.device_kind() in ("cpu", "cuda", "metal")


def test_reduced_float32_products_follows_mlx_enable_tf32(monkeypatch):
    gpu, cpu = mx.Device(mx.gpu), mx.Device(mx.cpu)
    monkeypatch.delenv(B.TF32_VARIABLE, raising=False)
    assert B.reduced_float32_products(gpu)  # MLX's default on a GPU
    assert not B.reduced_float32_products(cpu)  # the CPU computes in float32 always
    monkeypatch.setenv(B.TF32_VARIABLE, "0")
    assert not B.reduced_float32_products(gpu)
    monkeypatch.setenv(B.TF32_VARIABLE, "1")
    assert B.reduced_float32_products(gpu)
    assert B.device_description(cpu)["float32_products"] == "float32"


def test_the_tests_choose_mlx_s_float32_products_explicitly():
    # tests/conftest.py sets it (to 0, full float32) unless the run did: never MLX's silent default
    assert os.environ.get(B.TF32_VARIABLE) is not None
