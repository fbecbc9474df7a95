"""The emulator's compiler flags follow the clang it finds: clang 16 removed
``-fallow-half-arguments-and-returns``, and a flag a clang does not know stops every compile
(seen on a machine whose clang was newer than Debian 12's)."""

import stat
import subprocess

import pytest

from workbench.backends import BackendUnavailable, clang
from workbench.kernels import metal_toolchain

pytestmark = pytest.mark.skipif(clang() is None, reason="the Metal emulation needs clang++")


def _wrapper(tmp_path, refuse: str) -> str:
    """A clang that answers 'unknown argument' to any argument containing ``refuse``, as a
    newer clang answers a removed flag, and is the real clang otherwise."""
    path = tmp_path / "clang++"
    path.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do case "$a" in *' + refuse + "*) "
        "echo \"error: unknown argument: '$a'\" >&2; exit 1;; esac; done\n"
        f'exec {clang()} "$@"\n'
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_this_clang_gets_flags_that_compile_a_half_function():
    flags = metal_toolchain.clang_flags(clang())
    assert flags[: len(metal_toolchain.CLANG_FLAGS)] == metal_toolchain.CLANG_FLAGS
    src = "__fp16 twice(__fp16 x) { return x + x; }\n"
    r = subprocess.run([clang(), *flags, "-x", "c++", "-fsyntax-only", "-"], input=src, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_a_clang_without_the_removed_flag_gets_the_next_spelling(tmp_path):
    cc = _wrapper(tmp_path, "allow-half-arguments")
    flags = metal_toolchain.clang_flags(cc)
    assert "-fallow-half-arguments-and-returns" not in flags
    assert flags[: len(metal_toolchain.CLANG_FLAGS)] == metal_toolchain.CLANG_FLAGS


def test_a_clang_that_cannot_take_half_arguments_is_named(tmp_path):
    cc = _wrapper(tmp_path, "half")  # refuses -fnative-half-type too: no spelling works
    with pytest.raises(BackendUnavailable, match=r"cannot compile half parameters and results.*tried"):
        metal_toolchain.clang_flags(cc)
