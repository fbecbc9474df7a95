"""The dump form: files written as docs/DUMP_LAYOUT.md says (numpy + safetensors), read and
checked; a file with a missing tensor or a wrong shape is reported by name; nothing is written."""

import numpy as np
import pytest
from safetensors.numpy import save_file

from workbench.check import check_dump
from workbench.check.dump import DumpError, read_layer
from workbench.tail.ops import tail_np


def _write(path, n=40, seed=0, eps_outside=False, drop=None, bad_shape=None):
    rng = np.random.default_rng(seed)
    h, b, f = 64, 96, 80
    t = {"wo": rng.uniform(-.17, .17, (h, b)), "gate": rng.uniform(-.2, .2, (f, h)),
         "up": rng.uniform(-.2, .2, (f, h)), "down": rng.uniform(-.19, .19, (h, f)),
         "ffn_norm": 1 + rng.uniform(-.25, .25, h), "branch": rng.uniform(-1, 1, (n, b)) * 0.01,
         "residual": rng.uniform(-1, 1, (n, h)) * 0.01}
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
