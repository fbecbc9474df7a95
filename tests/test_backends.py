"""Backends: what is here, 'auto', and a clear error for what is not."""

from __future__ import annotations

import numpy as np
import pytest

from workbench import backends as B
from workbench import tail as T


@pytest.fixture
def clean_registry(monkeypatch):
    monkeypatch.setattr(B, "_KERNELS", {})
    return B._KERNELS


def test_graph_is_always_available(clean_registry):
    assert "graph" in B.available_backends()
    assert B.available_backends()[-1] == "graph"
    assert B.resolve_backend("graph") == "graph"


@pytest.mark.skipif(B.metal_available() or B.cuda_available(), reason="a GPU is here")
def test_auto_on_a_cpu_is_the_graph(clean_registry):
    assert B.available_backends() == ["graph"]
    assert B.resolve_backend("auto") == "graph"


@pytest.mark.skipif(B.metal_available(), reason="Metal is here")
def test_metal_absent_says_so(clean_registry):
    with pytest.raises(B.BackendUnavailable, match=r"Apple GPU.*mx.metal.is_available\(\) is False"):
        B.resolve_backend("metal")


@pytest.mark.skipif(B.cuda_available(), reason="CUDA is here")
def test_cuda_absent_says_so(clean_registry):
    with pytest.raises(B.BackendUnavailable, match=r"NVIDIA GPU.*mlx\[cuda13\]"):
        B.resolve_backend("cuda")


def test_device_here_but_no_kernel_registered(clean_registry, monkeypatch):
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    with pytest.raises(B.BackendUnavailable, match="no fused-tail cuda kernel is registered"):
        B.resolve_backend("cuda")
    assert B.resolve_backend("auto") == ("metal" if B.metal_available() and "metal" in B._KERNELS else "graph")


def test_a_registered_kernel_is_picked_by_auto_and_run_through_the_launch(clean_registry, monkeypatch):
    monkeypatch.setattr(B, "cuda_available", lambda: True)
    seen = {}

    def fake(launch, branch, residual):
        seen["launch"] = launch
        return np.zeros(np.shape(residual), np.float32)

    B.register_tail_kernel("cuda", fake)
    assert B.available_backends()[0] == "cuda"
    c = T.seed_case()
    out, name = T.fused_tail(c.weights, c.branch, c.residual, return_backend=True)
    assert name == "cuda" and out.shape == (64,)
    assert isinstance(seen["launch"], T.TailLaunch)  # the one builder assembled it


def test_backend_unavailable_is_a_runtime_error():
    assert issubclass(B.BackendUnavailable, RuntimeError)


def test_bad_names(clean_registry):
    with pytest.raises(ValueError, match="backend must be one of"):
        B.resolve_backend("opencl")
    with pytest.raises(ValueError, match="name must be 'metal' or 'cuda'"):
        B.register_tail_kernel("graph", lambda *a: None)
    with pytest.raises(ValueError, match="runner must be callable"):
        B.register_tail_kernel("metal", 3)
    with pytest.raises(B.BackendUnavailable):
        B.run_tail_kernel("graph", None, None, None)


def test_device_description_names_mlx():
    d = B.device_description()
    assert d["mlx_version"] and d["mlx_device"].startswith("Device(")
