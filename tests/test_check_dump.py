"""The dump form: files written as docs/DUMP_LAYOUT.md says (numpy + safetensors), read and
checked; a file with a missing tensor or a wrong shape is reported by name; nothing is written."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from workbench.check import check_dump
from workbench.check.dump import DumpError, read_layer


def _write(path, n=40, seed=0, eps_outside=False, drop=None, bad_shape=None):
    rng = np.random.default_rng(seed)
    h, b, f = 64, 96, 80
    t = {
        "wo": rng.uniform(-0.17, 0.17, (h, b)),
        "gate": rng.uniform(-0.2, 0.2, (f, h)),
        "up": rng.uniform(-0.2, 0.2, (f, h)),
        "down": rng.uniform(-0.19, 0.19, (h, f)),
        "ffn_norm": 1 + rng.uniform(-0.25, 0.25, h),
        "branch": rng.uniform(-1, 1, (n, b)) * 0.01,
        "residual": rng.uniform(-1, 1, (n, h)) * 0.01,
    }
    t = {k: v.astype(np.float32) for k, v in t.items()}
    x = t["residual"] + t["branch"] @ t["wo"].T
    ms = (x * x).mean(-1, keepdims=True)
    nx = x / ((np.sqrt(ms) + 1e-6) if eps_outside else np.sqrt(ms + np.float32(1e-6))) * t["ffn_norm"]
    g, u = nx @ t["gate"].T, nx @ t["up"].T
    t["output"] = (x + (g / (1 + np.exp(-g)) * u) @ t["down"].T).astype(np.float32)
    if drop:
        del t[drop]
    if bad_shape:
        t[bad_shape] = t[bad_shape][:, :-1]
    save_file(t, str(path), metadata={"eps": "1e-06", "model": "test", "layer": "0"})


def test_a_correct_engine_dump_is_judged_correct(tmp_path):
    for i in range(3):
        _write(tmp_path / f"layer{i}.safetensors", seed=i)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir())
    rep = check_dump(tmp_path)
    assert rep.passed, str(rep)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in tmp_path.iterdir()) == before  # only read


def test_eps_outside_the_root_in_a_dump_is_caught(tmp_path):
    for i in range(3):
        _write(tmp_path / f"layer{i}.safetensors", seed=i, eps_outside=True)
    assert not check_dump(tmp_path).passed


def test_bad_dumps_name_the_file_and_the_tensor(tmp_path):
    _write(tmp_path / "a.safetensors", drop="up")
    with pytest.raises(DumpError, match=r"a.safetensors.*'up'"):
        read_layer(tmp_path / "a.safetensors")
    _write(tmp_path / "b.safetensors", bad_shape="down")
    with pytest.raises(DumpError, match=r"b.safetensors.*'down'"):
        read_layer(tmp_path / "b.safetensors")
    _write(tmp_path / "c.safetensors", n=40)
    rep = check_dump(tmp_path)  # the good file is checked, the bad ones reported
    assert not rep.passed and any("a.safetensors" in p for p in rep.problems)


@pytest.mark.parametrize(
    "dtype,quant,fold",
    [("float32", None, 16), ("bfloat16", None, None), ("float16", {"mode": "affine", "bits": 4, "group_size": 32}, 16)],
)
def test_write_layer_round_trips_the_stored_weights(tmp_path, dtype, quant, fold):
    from workbench.check.dump import write_layer
    from workbench.studies.cases import case_weights
    from workbench.tail import fused_tail

    w, b, r = case_weights((64, 96, 128), 5, dtype=dtype, fold=fold, quantize=quant)
    B, R = np.stack([b, 2 * b]), np.stack([r, 2 * r])
    out = fused_tail(w, B, R, backend="graph")
    path = write_layer(tmp_path / "l.safetensors", w, B, R, out, model="m", layer=3)
    got = read_layer(path)
    for name in ("wo", "gate", "up", "down"):
        np.testing.assert_array_equal(getattr(got.weights, name).dense(np.float64), getattr(w, name).dense(np.float64))
    assert got.weights.wo.dtype == w.wo.dtype and got.weights.eps == w.eps and got.meta["layer"] == "3"
    assert (got.weights.wo.fold is None) == (fold is None)
    np.testing.assert_array_equal(got.output, out)
    rep = check_dump(path)
    assert rep.passed and (rep.cases.worst == rep.cases.ref_worst).all(), str(rep)  # the graph's own output
    with pytest.raises(Exception, match="exists"):
        write_layer(path, w, B, R, out)


def test_write_layer_refuses_rows_that_disagree(tmp_path):
    from workbench.check.dump import write_layer
    from workbench.studies.cases import case_weights

    w, b, r = case_weights((64, 96, 80), 1)
    with pytest.raises(ValueError, match="residual"):
        write_layer(tmp_path / "x.safetensors", w, b[None], r[None, :10], r[None])
    assert not (tmp_path / "x.safetensors").exists()


def test_a_truncated_dump_is_refused_by_name(tmp_path):
    _write(tmp_path / "whole.safetensors")
    data = (tmp_path / "whole.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(DumpError, match="cut.safetensors"):
        read_layer(tmp_path / "cut.safetensors")
