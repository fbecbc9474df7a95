"""The emulator's compile cache is verified on load: a truncated, empty, scrambled or swapped
entry is rebuilt (atomically, under its lock), never loaded. Each run is a subprocess, so a
bad shared object loaded by mistake shows as a crash (a signal), not as this test process dying."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import backends
from workbench.kernels import metal_emulation

pytestmark = pytest.mark.skipif(backends.clang() is None, reason="the Metal emulator needs clang++")

RUN = """
import mlx.core as mx, numpy as np
from workbench import metal_kernel
k = metal_kernel(name="NAME", input_names=["inp"], output_names=["out"],
                 source="uint i = thread_position_in_grid.x; out[i] = inp[i] * SCALEf;")
(o,) = k(inputs=[mx.arange(64).astype(mx.float32)], grid=(64, 1, 1), threadgroup=(32, 1, 1),
         output_shapes=[(64,)], output_dtypes=[mx.float32])
assert np.array_equal(np.array(o), np.arange(64, dtype=np.float32) * SCALE), np.array(o)
print("ok")
"""


def _run(cache: Path, name: str = "twice", scale: str = "2.0") -> None:
    env = {**os.environ, "WORKBENCH_METAL_EMULATION_CACHE": str(cache)}
    r = subprocess.run(
        [sys.executable, "-c", RUN.replace("NAME", name).replace("SCALE", scale)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])


def _kernels(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*.so"))


def _truncate(p: Path) -> None:
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _empty(p: Path) -> None:
    p.write_bytes(b"")


def _scramble(p: Path) -> None:
    data = bytearray(p.read_bytes())
    for i in range(64, len(data), 97):
        data[i] ^= 0x5A
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _empty, _scramble])
def test_a_damaged_entry_is_rebuilt_not_loaded(tmp_path, damage):
    _run(tmp_path)
    (so,) = _kernels(tmp_path)
    damage(so)
    assert not metal_emulation.cached_entry_ok(so)
    _run(tmp_path)
    assert metal_emulation.cached_entry_ok(so)


def test_swapped_entries_are_rebuilt(tmp_path):
    _run(tmp_path, "twice", "2.0")
    first = set(_kernels(tmp_path))
    _run(tmp_path, "thrice", "3.0")
    (a,) = first
    (b,) = set(_kernels(tmp_path)) - first
    da, db = a.read_bytes(), b.read_bytes()
    a.write_bytes(db)
    b.write_bytes(da)
    assert not metal_emulation.cached_entry_ok(a) and not metal_emulation.cached_entry_ok(b)
    _run(tmp_path, "twice", "2.0")  # would compute x3 if the swapped object were loaded
    _run(tmp_path, "thrice", "3.0")
    assert metal_emulation.cached_entry_ok(a) and metal_emulation.cached_entry_ok(b)


def test_an_entry_without_its_sum_is_rebuilt(tmp_path):
    _run(tmp_path)
    (so,) = _kernels(tmp_path)
    so.with_name(so.name + ".sum").unlink()
    _run(tmp_path)
    assert metal_emulation.cached_entry_ok(so)
