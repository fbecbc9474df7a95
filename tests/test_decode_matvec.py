"""The decode step's matvecs: each kernel launch the step prepares against the MLX-ops product.

The kernels run here as their Metal form compiled by clang and executed on the CPU
(``kernel_launch.emulate_launch``): the same template values, grids and inputs the CUDA
and Metal launches get, so a wrong width, row count, input order or format shows up here.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from workbench import backends
from workbench.decode import matvec as D
from workbench.decode.geometry import Geometry
from workbench.decode.schedule import Schedule
from workbench.decode.state import HybridWeights, new_state
from workbench.kernels import emulated as K
from workbench.models.loader import load_model

#: Bonsai's layer pattern at widths every format serves (in dimensions multiples of 64).
SMALL = Geometry(
    hidden=64,
    ffn=128,
    n_q=4,
    n_kv=1,
    head_dim=16,
    attn_output_gate=True,
    gdn_k_heads=2,
    gdn_v_heads=4,
    gdn_k_dim=16,
    gdn_v_dim=16,
    conv_kernel=4,
    vocab=64,
)
MIXED = 2 * SMALL.gdn_k_heads * SMALL.gdn_k_dim + SMALL.gdn_v_heads * SMALL.gdn_v_dim

#: Each product is one float32 dot product a row on both sides, summed in another order:
#: rounding apart. Metric: max |difference| / max(max |reference|, 1); measured 1e-7 to 5e-7.
TOL = 1e-5

needs_clang = pytest.mark.skipif(not backends.clang_available(), reason="the Metal emulation needs clang")


def _emulate(launch: D.Launch, *xs: mx.array) -> list[np.ndarray]:
    return K.emulate_launch(launch.kernel, launch.inputs(*xs), launch.kw)


@pytest.fixture(scope="module")
def bonsai():
    return load_model("bonsai-27b")


@needs_clang
@pytest.mark.parametrize("quant", [None, "affine4"])
def test_every_kernel_launch_of_the_step_is_the_mlx_product(bonsai, quant):
    w = HybridWeights(bonsai, SMALL, dtype="bfloat16", seed=3, share=True, quant=quant)
    km, ref = D.KernelMatvecs(SMALL.eps, "metal"), D.MlxMatvecs(SMALL.eps, "float32")
    rng = np.random.default_rng(0)
    x = mx.array(rng.uniform(-1, 1, SMALL.hidden).astype(np.float32))
    attn, rec = w.layers[3].w, w.layers[0].w
    assert w.layers[3].kind == "attention" and w.layers[0].kind == "recurrent"
    errors = {}
    for name, got, want in (
        ("qkv", _emulate(km.qkv_launch(attn), x), ref.attn_qkv(attn, x)),
        ("gdn_in", _emulate(km.gdn_in_launch(rec, MIXED), x), ref.gdn_in(rec, x, MIXED)),
    ):
        assert [g.shape for g in got] == [tuple(v.shape) for v in want]
        errors[name] = max(D.worst_scaled_error(g, np.array(v)) for g, v in zip(got, want))
    launch, zeros = km.logits_launch(w.lm_head)
    (lg,) = _emulate(launch, D.rms(x, w.final_norm, SMALL.eps), zeros)
    errors["logits"] = D.worst_scaled_error(lg, np.array(ref.logits(w.lm_head, w.final_norm, x)))
    for lw, name, width in ((attn, "wo", SMALL.branch), (rec, "out", SMALL.gdn_v_heads * SMALL.gdn_v_dim)):
        v = mx.array(rng.uniform(-1, 1, width).astype(np.float32))
        t = km.tail(lw, name)
        (h,) = K.emulate_launch(t._wo[0], [v, *t._wo[1], x], t._wo[2])
        errors[name] = D.worst_scaled_error(h, np.array(ref.out_add(lw, name, v, x)))
        (act,) = K.emulate_launch(t._gu[0], [mx.array(h), *t._gu[1]], t._gu[2])
        (out,) = K.emulate_launch(t._dn[0], [mx.array(act), mx.array(h), *t._dn[1]], t._dn[2])
        errors[f"ffn after {name}"] = D.worst_scaled_error(out, np.array(ref.ffn(lw, mx.array(h))))
    assert max(errors.values()) <= TOL, errors


def test_a_launch_is_prepared_once_per_layer_weights(bonsai):
    w = HybridWeights(bonsai, SMALL, dtype="bfloat16", seed=3, share=True)
    km = D.KernelMatvecs(SMALL.eps, "metal")  # preparing runs nothing
    attn = w.layers[3].w
    assert km.qkv_launch(attn) is km.qkv_launch(w.layers[7].w)  # shared weights: one launch
    assert km.tail(attn, "wo") is km.tail(attn, "wo")
    tmpl = dict(km.gdn_in_launch(w.layers[0].w, MIXED).kw["template"])
    assert (tmpl["NQ"], tmpl["NK"], tmpl["NV"], tmpl["ROT"]) == (MIXED, 64, 8, False)


def test_the_kernels_path_is_never_a_silent_fallback(bonsai):
    with pytest.raises(ValueError, match="matvec: must be one of"):
        D.resolve_matvec("graph")
    if D.kernel_dialect() is not None:
        assert D.resolve_matvec("kernels")[0] == "kernels"
        return
    w = HybridWeights(bonsai, SMALL, seed=3, share=True)
    with pytest.raises(backends.BackendUnavailable, match="matvec: 'kernels' needs a kernel backend"):
        Schedule(bonsai, w, matvec="kernels")
    with pytest.raises(backends.BackendUnavailable):
        D.make_matvecs("kernels", 1e-6)


def test_float32_activations_and_quantized_weights_decode(bonsai):
    """The MLX path in both activation modes and at 4-bit: every stage the same tokens."""
    for quant, activations in ((None, "float32"), ("affine4", "weights")):
        w = HybridWeights(bonsai, SMALL, dtype="bfloat16", seed=3, share=True, quant=quant)
        sched = Schedule(bonsai, w, activations=activations)
        toks = {}
        for n in (1, 2, 5):
            st = new_state(w, context=4, max_new=4)
            toks[n] = [sched.step(st, n).next_token for _ in range(2)]
        assert toks[1] == toks[2] == toks[5]
    dense = HybridWeights(bonsai, SMALL, dtype="bfloat16", seed=3, share=True)
    elems = (
        sum(
            SMALL.layer_params("attention" if lc.index in set(bonsai.attention_layers()) else "recurrent")
            for lc in bonsai.layers
        )
        + SMALL.vocab * SMALL.hidden
    )
    assert dense.bytes_per_token() > 2 * elems  # the matrices, and the small float32 vectors beside them
    assert dense.bytes_per_token() < 2 * elems * 1.1
    # 4-bit g64 with bf16 scales and biases: 4 + 32/64 bits a weight, about 0.28 of bf16's 16.
    assert w.bytes_per_token() / dense.bytes_per_token() == pytest.approx(4.5 / 16, rel=0.1)


def test_bad_arguments(bonsai):
    with pytest.raises(ValueError, match="quant: must be one of"):
        HybridWeights(bonsai, SMALL, quant="int3")
    w = HybridWeights(bonsai, SMALL, seed=3, share=True)
    with pytest.raises(ValueError, match="activations: must be one of"):
        Schedule(bonsai, w, activations="half")
    with pytest.raises(ValueError, match="a: must have b's shape"):
        D.worst_scaled_error(np.zeros(3), np.zeros(4))
