"""The dump form: files written as docs/DUMP_LAYOUT.md says (numpy + safetensors), read and
checked; a file with a missing tensor or a wrong shape is reported by name; nothing is written."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from workbench.check import check_dump
from workbench.check.dump import DumpError, read_layer


def _write(path, n=40, seed=0, eps_outside=False, drop=None, bad_shape=None, extra=None, meta=None):
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
    t.update(extra or {})
    save_file(t, str(path), metadata={"eps": "1e-06", "model": "test", "layer": "0", **(meta or {})})


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


def test_a_fold_half_written_is_refused_naming_the_file_and_the_key(tmp_path):
    signs = np.where(np.arange(96) % 3 == 0, -1.0, 1.0).astype(np.float32)
    _write(tmp_path / "signs_only.safetensors", extra={"fold.signs": signs})
    with pytest.raises(DumpError, match=r"signs_only.safetensors: metadata 'fold_block' is missing"):
        read_layer(tmp_path / "signs_only.safetensors")
    _write(tmp_path / "block_only.safetensors", meta={"fold_block": "16"})
    with pytest.raises(DumpError, match=r"block_only.safetensors: tensor 'fold.signs' is missing.*'16'"):
        read_layer(tmp_path / "block_only.safetensors")
    _write(tmp_path / "short.safetensors", extra={"fold.signs": signs[:-1]}, meta={"fold_block": "16"})
    with pytest.raises(DumpError, match=r"short.safetensors: tensor 'fold.signs' has shape \(95,\)"):
        read_layer(tmp_path / "short.safetensors")
    _write(tmp_path / "whole.safetensors")
    rep = check_dump(tmp_path)  # the good file judged; each half-written fold named, never read as another map
    assert not rep.passed and len(rep.problems) == 3
    for name in ("signs_only", "block_only", "short"):
        assert any(r.startswith(f"file not read: {name}.safetensors: ") for r in rep.reasons), rep.reasons


def test_write_layer_writes_a_fold_without_signs_as_all_plus_one(tmp_path):
    from workbench.check.dump import write_layer
    from workbench.fold.rotation import HadamardFold
    from workbench.fold.weights import WeightMatrix
    from workbench.studies.cases import case_weights
    from workbench.tail import fused_tail
    from workbench.tail.weights import TailWeights

    w0, b, r = case_weights((64, 96, 80), 2)
    wo = WeightMatrix(w0.wo.dense(np.float32), HadamardFold(16, None))
    w = TailWeights(wo, w0.ffn_norm, w0.gate, w0.up, w0.down, eps=w0.eps)
    out = fused_tail(w, b[None], r[None], backend="graph")
    got = read_layer(write_layer(tmp_path / "l.safetensors", w, b[None], r[None], out))
    np.testing.assert_array_equal(got.weights.wo.fold.signs, np.ones(96))
    np.testing.assert_array_equal(fused_tail(got.weights, b[None], r[None], backend="graph"), out)


def test_every_broken_file_is_named_with_what_is_wrong(tmp_path):
    for i in range(8):
        _write(tmp_path / f"bad{i}.safetensors", drop=("up", "gate", "ffn_norm", "output")[i % 4])
    with pytest.raises(ValueError) as e:
        check_dump(tmp_path)
    msg = str(e.value)
    assert msg.startswith("path: no dump file could be read: ") and "\n" not in msg
    for i in range(8):
        assert f"bad{i}.safetensors: tensor '{('up', 'gate', 'ffn_norm', 'output')[i % 4]}' is missing" in msg, msg


def test_a_failing_dump_names_its_files_and_rows(tmp_path):
    _write(tmp_path / "good.safetensors", seed=1)
    for i in range(2):
        _write(tmp_path / f"eps{i}.safetensors", seed=i, eps_outside=True)
    rep = check_dump(tmp_path, tolerance=1e-7)
    assert not rep.passed
    text = " ".join(rep.reasons)
    assert "seed 0 at scale" not in text and "first: eps0.safetensors row " in text, rep.reasons
    assert "in 2 file(s): eps0.safetensors, eps1.safetensors" in text, rep.reasons
