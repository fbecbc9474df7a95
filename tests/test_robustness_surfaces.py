"""The surfaces added after the numeric API answer bad input with a clear error, never a crash.

Checkpoint files (GGUF headers, safetensors headers, config.json), a checkpoint's metadata
against its tensors, ``load_model`` given a path, the decode schedule's geometry and its
step past the end, and the newer surfaces (mlx-lm models, the kernels' widths, a decode
state, the stages' harness: ``_newer_cases``). A corrupt file is loaded in a child process, so a segfault or an abort
fails the test instead of ending the run: the child must exit 0 having seen a ValueError
that names the file.
"""

from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest

from workbench.decode.geometry import CPU_GEOMETRY, Geometry
from workbench.models import families as MF
from workbench.models.loader import load_model
from workbench.real_models.gguf_header import check_gguf_header
from workbench.real_models.safetensors_header import check_safetensors_header


def _s(text: str, wide: bool = True) -> bytes:
    b = text.encode()
    return (struct.pack("<Q", len(b)) if wide else struct.pack("<I", len(b))) + b


def gguf_bytes(
    *,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    key_len: int | None = None,
    n_dims: int = 2,
    dims: tuple[int, ...] = (32, 4),
    ttype: int = 0,
    offset: int = 0,
    data: int | None = None,
) -> bytes:
    """A GGUF v3 file with one key/value and one F32 tensor, fields overridable (the spec's layout)."""
    kv = (struct.pack("<Q", key_len) if key_len is not None else b"") + (
        b"general.architecture"[:key_len] if key_len is not None and key_len < 100 else b""
    )
    kv = kv if key_len is not None else _s("general.architecture")
    kv += struct.pack("<I", 8) + _s("llama")
    info = _s("t.weight") + struct.pack("<I", n_dims) + b"".join(struct.pack("<Q", d) for d in dims[:n_dims])
    info += b"".join(struct.pack("<Q", 1) for _ in range(max(0, n_dims - len(dims))))
    info += struct.pack("<I", ttype) + struct.pack("<Q", offset)
    head = b"GGUF" + struct.pack("<I", 3) + struct.pack("<Q", 1 if n_tensors is None else n_tensors)
    head += struct.pack("<Q", 1 if n_kv is None else n_kv) + kv + info
    head += b"\0" * (-len(head) % 32)
    nbytes = int(np.prod(dims)) * 4 if data is None else data
    return head + b"\1" * nbytes


GOOD = gguf_bytes()
CORRUPT = {
    "tensor count 2^40": gguf_bytes(n_tensors=2**40),
    "tensor count 2^60": gguf_bytes(n_tensors=2**60),
    "tensor count 2": gguf_bytes(n_tensors=2),
    "kv count 2^40": gguf_bytes(n_kv=2**40),
    "kv count 2^60": gguf_bytes(n_kv=2**60),
    "key length 2^40": gguf_bytes(key_len=2**40),
    "key length 2^60": gguf_bytes(key_len=2**60),
    "9 dimensions": gguf_bytes(n_dims=9),
    "0 dimensions": gguf_bytes(n_dims=0),
    "a zero dimension": gguf_bytes(dims=(32, 0)),
    "an unknown type": gguf_bytes(ttype=99),
    "an unaligned offset": gguf_bytes(offset=3),
    "an offset past the end": gguf_bytes(offset=1 << 40),
    "data truncated": gguf_bytes(data=100),
    "no data": gguf_bytes(data=0),
    "empty": b"",
    "magic only": b"GGUF",
    "not GGUF": b"PK\3\4" + bytes(200),
    "version 99": b"GGUF" + struct.pack("<I", 99) + bytes(64),
}
CORRUPT.update({f"truncated at {n}": GOOD[:n] for n in (6, 12, 20, 30, 45, 60, 80, len(GOOD) - 1)})


def test_a_valid_header_reads():
    p = Path(pytest.importorskip("tempfile").mkdtemp()) / "good.gguf"
    p.write_bytes(GOOD)
    h = check_gguf_header(p)
    assert [t.name for t in h.tensors] == ["t.weight"] and h.tensors[0].nbytes == 32 * 4 * 4


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_gguf_header_is_refused_naming_the_file(tmp_path, case):
    p = tmp_path / "bad.gguf"
    p.write_bytes(CORRUPT[case])
    with pytest.raises(ValueError, match=r"^source: GGUF file bad\.gguf"):
        check_gguf_header(p)


def test_corrupt_ggufs_never_crash_load_checkpoint(tmp_path):
    """Every corrupt file through the public loader, in one child: a crash is a non-zero exit."""
    for i, case in enumerate(sorted(CORRUPT)):
        (tmp_path / f"c{i}.gguf").write_bytes(CORRUPT[case])
    code = (
        "import sys, pathlib\n"
        "from workbench.real_models.checkpoint import load_checkpoint\n"
        "bad = 0\n"
        "for p in sorted(pathlib.Path(sys.argv[1]).glob('*.gguf')):\n"
        "    try:\n        load_checkpoint(p)\n        bad += 1; print('LOADED', p.name)\n"
        "    except ValueError as e:\n"
        "        if p.name not in str(e) or not str(e).startswith('source:'): bad += 1; print('UNCLEAR', e)\n"
        "    except Exception as e:\n        bad += 1; print('LEAKED', type(e).__name__, e)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])


def _safetensors(header: object, data: bytes) -> bytes:
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h)) + h + data


SAFETENSORS_BAD = [
    b"",
    b"\1\2",
    struct.pack("<Q", 1 << 40) + b"{}",
    _safetensors(b"\xff\xfe{", b""),
    _safetensors(b"[1, 2]", b""),
    _safetensors(b"{not json", b""),
    _safetensors({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, bytes(10)),
    _safetensors({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}, bytes(64)),
    _safetensors({"w": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}, bytes(16)),
    _safetensors({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, bytes(16)),
    _safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, bytes(16)),
    _safetensors({"w": [1]}, bytes(16)),
]


@pytest.mark.parametrize("blob", SAFETENSORS_BAD)
def test_corrupt_safetensors_header_is_refused_naming_the_file(tmp_path, blob):
    p = tmp_path / "model.safetensors"
    p.write_bytes(blob)
    with pytest.raises(ValueError, match=r"^source: safetensors file model\.safetensors"):
        check_safetensors_header(p)


def test_a_valid_safetensors_header_reads(tmp_path):
    p = tmp_path / "ok.safetensors"
    mx.save_safetensors(str(p), {"w": mx.ones((4, 3))})
    assert check_safetensors_header(p) == {"w": ("F32", (4, 3))}


def test_config_json_not_utf8_and_zero_heads_are_clear(tmp_path):
    (tmp_path / "config.json").write_bytes(b'{"model_type": "llama", "_name": "\xff"}')
    with pytest.raises(ValueError, match="not UTF-8"):
        MF.from_hf_config(tmp_path / "config.json")
    raw = dict(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=0,
        num_key_value_heads=1,
        intermediate_size=128,
        rms_norm_eps=1e-6,
        hidden_act="silu",
    )
    with pytest.raises(ValueError, match="num_attention_heads"):
        MF.from_hf_config(raw)


def test_load_model_takes_a_config_path_and_names_the_alternative():
    assert load_model(Path("data/models/bonsai-27b.json").resolve()).hidden_size == load_model("bonsai-27b").hidden_size
    with pytest.raises(ValueError, match="config.json's path.*load_checkpoint"):
        load_model("no-such-model")


BAD_EPS = [float("nan"), -1e-6, 0.0, float("inf"), "1e-6", True]


@pytest.mark.parametrize("eps", BAD_EPS)
def test_geometry_refuses_a_bad_eps(eps):
    fields = {f: getattr(CPU_GEOMETRY, f) for f in CPU_GEOMETRY.__dataclass_fields__}
    with pytest.raises(ValueError, match="^eps:"):
        Geometry(**{**fields, "eps": eps})


def test_schedule_step_past_its_caches_and_with_a_bad_state_is_clear():
    from workbench.decode.schedule import Schedule
    from workbench.decode.state import HybridWeights, new_state

    cfg = load_model("bonsai-27b")
    tiny = Geometry(
        hidden=32,
        ffn=48,
        n_q=4,
        n_kv=1,
        head_dim=8,
        attn_output_gate=True,
        gdn_k_heads=1,
        gdn_v_heads=2,
        gdn_k_dim=8,
        gdn_v_dim=8,
        conv_kernel=4,
        vocab=64,
    )
    w = HybridWeights(cfg, tiny, seed=3)
    sched = Schedule(cfg, w)
    st = new_state(w, context=1, max_new=1)
    sched.step(st, 1)
    with pytest.raises(ValueError, match="^state: its KV caches hold 2 tokens"):
        sched.step(st, 1)
    for bad in (None, 3, "state", {}):
        with pytest.raises(ValueError, match="^state:"):
            sched.step(bad, 1)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench.tail_bench", "--bandwidth-gbps", "0", "--no-record"], "--bandwidth-gbps must be a finite number > 0"),
        (["bench.tail_bench", "--bandwidth-gbps=-1", "--no-record"], "--bandwidth-gbps must be a finite number > 0"),
        (["bench.schedule_run", "--vocab", "0", "--no-record"], "--vocab must be >= 1"),
        (["bench.schedule_run", "--model", "nope", "--no-record"], "--model nope: name: unknown model"),
    ],
)
def test_bench_commands_refuse_falsy_and_unknown_values_in_one_line(argv, message):
    """Falsy values are refused, never replaced by a default; the message is one line, no traceback."""
    r = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


BAD_TOKENS = [
    ([1, 2, 10**6], "10"),
    ([1, -1], "-1"),
    ([1, 2.0], "2.0"),
    ([True], "True"),
    ([], "empty"),
    ("12", "'12'"),
    (None, "None"),
]


@pytest.mark.parametrize("tokens, bad", BAD_TOKENS)
def test_real_model_helpers_refuse_ids_outside_the_vocabulary(tokens, bad):
    from workbench.validate import token_ids

    with pytest.raises(ValueError, match=r"^tokens: must"):
        token_ids("tokens", tokens, 49152)


def test_smollm2_helpers_refuse_bad_ids_and_an_unbounded_n():
    from workbench import real_models as CK
    from workbench import real_models as RM
    from workbench.real_models.mlx_lm_model import reference_model

    try:
        path = CK.smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model = reference_model(CK.load_checkpoint(path))
    vocab = RM.vocab_size(model)
    assert vocab == 49152
    for call in (
        lambda: RM.capture_layers(model, [1, vocab]),
        lambda: RM.greedy(model, [1, -3], 1),
        lambda: RM.forced_choices(model, [1, 2.5, 3], 1),
    ):
        with pytest.raises(ValueError, match=r"^(tokens|prompt|sequence): must hold token ids"):
            call()
    with pytest.raises(ValueError, match=r"^n: "):
        RM.greedy(model, [1, 2], 10**9)
    with pytest.raises(ValueError, match=r"^start: "):
        RM.forced_choices(model, [1, 2, 3], 5)


# --- Every bench command and tool: bad arguments and bad files end in one line, never a traceback ---

ROOT = Path(__file__).resolve().parent.parent


#: Files the command cases below are handed, written into the case folder by :func:`_command_files`.
def _command_files(d: Path) -> None:
    (d / "a_file").write_text("not a folder\n")
    (d / "not_json.json").write_text('{"a": 1')
    (d / "binary.json").write_bytes(bytes(range(256)) * 2)
    (d / "list.json").write_text("[1, 2]\n")
    (d / "empty.json").write_bytes(b"")
    (d / "check_rate.json").write_text(json.dumps({"bench": "check_rate", "results": {}}))
    (d / "gpu_check_no_cases.json").write_text(
        json.dumps({"command": "python -m bench.gpu_check", "bench": {"cases": []}})
    )
    (d / "kernel_bench_bad_case.json").write_text(
        json.dumps({"command": "python -m bench.kernel_bench", "bench": {"cases": [{"case": "x"}]}})
    )
    (d / "existing.json").write_text("{}\n")
    (d / "folder").mkdir()
    for name in ("binary", "not_json", "list", "empty"):
        (d / f"{name}.ipynb").write_bytes((d / f"{name}.json").read_bytes())
    nb = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (d / "no_cells.ipynb").write_text(json.dumps({k: v for k, v in nb.items() if k != "cells"}))
    (d / "cells_int.ipynb").write_text(json.dumps({**nb, "cells": 3}))
    (d / "cell_no_source.ipynb").write_text(json.dumps({**nb, "cells": [{"cell_type": "code", "metadata": {}}]}))
    (d / "nbformat3.ipynb").write_text(json.dumps({**nb, "nbformat": 3}))


#: (module, argv with {d} for the case folder, what the message must say). Every argument
#: is bad in exactly one way; the command must refuse it before measuring anything.
COMMAND_CASES: list[tuple[str, list[str], str]] = [
    # the record's folder and file, checked when the arguments are parsed
    ("bench.wait_price", ["--out-dir", "{d}/a_file"], "argument --out-dir: {d}/a_file is a file, not a folder"),
    ("bench.wait_price", ["--out-dir", "{d}/a_file/sub"], "lies under {d}/a_file, which is not a folder"),
    ("bench.wait_price", ["--out", "{d}/a_file/x.json"], "--out: {d}/a_file/x.json: {d}/a_file is a file, not"),
    ("bench.wait_price", ["--out", "{d}/folder"], "argument --out: {d}/folder is a folder"),
    ("bench.wait_price", ["--out", "{d}/existing.json"], "existing.json exists; pass --force"),
    ("bench.wait_price", ["--n", "0"], "--n must be >= 10"),
    ("bench.wait_price", ["--warmup", "-1"], "--warmup must be >= 0"),
    ("bench.wait_price", ["--device", "tpu"], "argument --device: invalid choice"),
    ("bench.wait_price", ["--n", "x"], "argument --n: invalid int value"),
    ("bench.wait_price", ["--add", "{d}/not_json.json"], "--add: cannot read the record"),
    ("bench.wait_price", ["--add", "{d}/binary.json"], "--add: cannot read the record"),
    ("bench.wait_price", ["--add", "{d}/empty.json"], "--add: cannot read the record"),
    ("bench.wait_price", ["--add", "{d}/missing.json"], "--add: cannot read the record"),
    ("bench.wait_price", ["--add", "{d}/list.json"], "is not a wait_price record"),
    ("bench.wait_price", ["--add", ""], "--add: cannot read the record"),
    ("bench.wait_price", ["--ledger", "{d}/folder"], "argument --ledger: '{d}/folder' is a folder"),
    ("bench.wait_price", ["--ledger", ""], "argument --ledger: '' is not a file that exists"),
    ("bench.split_price", ["--ledger", "{d}/missing.json"], "is not a file that exists"),
    ("bench.split_price", ["--add", "{d}/binary.json"], "--add: {d}/binary.json"),
    ("bench.split_price", ["--add", "{d}/missing.json"], "--add: {d}/missing.json"),
    ("bench.split_price", ["--add", "{d}/list.json"], "bench.schedule_run record with split prices"),
    ("bench.split_price", ["--n", "-3"], "--n must be >= 5"),
    ("bench.split_price", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.schedule_run", ["--budget-s", "-1"], "--budget-s must be a finite number of seconds >= 0"),
    ("bench.schedule_run", ["--budget-s", "nan"], "--budget-s must be a finite number of seconds >= 0"),
    ("bench.schedule_run", ["--stages", "99"], "--stages must be distinct stage numbers"),
    ("bench.schedule_run", ["--stages", "-1"], "--stages must be distinct stage numbers"),
    ("bench.schedule_run", ["--stages", "1,1"], "--stages must be distinct stage numbers"),
    ("bench.schedule_run", ["--stages", ","], "--stages must be comma-separated stage numbers"),
    ("bench.schedule_run", ["--split-n", "1"], "--split-n must be 0 (no split prices) or >= 5"),
    ("bench.schedule_run", ["--split-n", "-1"], "--split-n must be >= 0"),
    ("bench.schedule_run", ["--vocab", "-5"], "--vocab must be >= 1"),
    ("bench.schedule_run", ["--vocab", "0"], "--vocab must be >= 1"),
    ("bench.schedule_run", ["--geometry", "full", "--vocab", "-1"], "--vocab must be >= 1"),
    ("bench.schedule_run", ["--seed", "-1"], "--seed must be >= 0"),
    ("bench.schedule_run", ["--check-tol", "-1"], "--check-tol must be a finite number > 0"),
    ("bench.schedule_run", ["--check-tol", "nan"], "--check-tol must be a finite number > 0"),
    ("bench.schedule_run", ["--tokens", "0"], "--tokens must be >= 1"),
    ("bench.schedule_run", ["--rounds", "0"], "--rounds must be >= 1"),
    ("bench.schedule_run", ["--context", "0"], "--context must be >= 1"),
    ("bench.schedule_run", ["--context", "2000000"], "must each be <= 1048576"),
    ("bench.schedule_run", ["--tokens", "1000000000"], "must each be <= 1048576"),
    ("bench.schedule_run", ["--price-n", "5"], "--price-n must be >= 10"),
    ("bench.schedule_run", ["--model", "nope"], "--model nope: name: unknown model"),
    ("bench.schedule_run", ["--model", "llama-3.1-8b"], "a hybrid with attention layers and at least two recurrent"),
    ("bench.schedule_run", ["--gdn", "kernel"], "--gdn kernel: the gdn_step kernel runs with the project's kernels"),
    ("bench.schedule_run", ["--out", "{d}/a_file/x.json"], "is a file, not a folder"),
    ("bench.schedule_run", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.sweep_rate", ["--mutations", "-1"], "--mutations must be >= 0"),
    ("bench.sweep_rate", ["--seeds", "0"], "--seeds must be >= 1"),
    ("bench.sweep_rate", ["--configs", "nope"], "--configs must be a comma-separated list"),
    ("bench.sweep_rate", ["--configs", ","], "--configs must be a comma-separated list"),
    ("bench.sweep_rate", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.check_rate", ["--cases", "-1"], "--cases must be >= 100"),
    ("bench.check_rate", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.emulator_cost", ["--n", "2"], "--n must be >= 3"),
    ("bench.emulator_cost", ["--order", "sideways"], "argument --order: invalid choice"),
    ("bench.emulator_cost", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.tail_bench", ["--shapes", "nope"], "--shapes must be a comma-separated list"),
    ("bench.tail_bench", ["--repeats", "-1"], "--repeats must be >= 1"),
    ("bench.tail_bench", ["--warmup", "-1"], "--warmup must be >= 0"),
    ("bench.tail_bench", ["--large-repeats", "0"], "--large-repeats must be >= 1"),
    ("bench.tail_bench", ["--bandwidth-gbps", "inf"], "--bandwidth-gbps must be a finite number > 0"),
    ("bench.tail_bench", ["--bandwidth-gbps", "nan"], "--bandwidth-gbps must be a finite number > 0"),
    ("bench.tail_bench", ["--seed", "-1"], "--seed must be >= 0"),
    ("bench.tail_bench", ["--dtype", "int8"], "argument --dtype: invalid choice"),
    ("bench.tail_bench", ["--out-dir", "{d}/a_file"], "is a file"),
    ("bench.kernel_plot", ["{d}/binary.json"], "is not a readable JSON record"),
    ("bench.kernel_plot", ["{d}/missing.json"], "record: no file {d}/missing.json"),
    ("bench.kernel_plot", ["{d}/empty.json"], "is not a readable JSON record"),
    ("bench.kernel_plot", ["{d}/not_json.json"], "is not a readable JSON record"),
    ("bench.kernel_plot", ["{d}/list.json"], "holds a JSON list, not a record"),
    ("bench.kernel_plot", ["{d}/folder"], "is not a readable JSON record"),
    ("bench.kernel_plot", ["{d}/check_rate.json"], "is a check_rate record; this plot reads"),
    ("bench.kernel_plot", ["{d}/gpu_check_no_cases.json"], "has no benchmark cases"),
    ("bench.kernel_plot", ["{d}/kernel_bench_bad_case.json"], "a case lacks what the plot reads"),
    ("bench.kernel_bench", ["--repeats", "-1"], "--repeats must be >= 1"),
    ("bench.kernel_bench", ["--seed", "-1"], "--seed must be >= 0"),
    ("bench.kernel_bench", ["--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.gpu_check", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench.gpu_check", ["--seed", "-1"], "--seed must be >= 0"),
    ("bench.kernel_bodies", ["--old", "{d}/missing"], "--old must be a kernels folder"),
    ("bench.kernel_bodies", ["--old", "{d}/a_file"], "--old must be a kernels folder"),
    ("bench.kernel_bodies", ["--old", "kernels", "--rounds", "-1"], "--rounds must be >= 1"),
    ("bench.kernel_bodies", ["--old", "kernels", "--tails", "0"], "--tails must be >= 1"),
    ("bench.kernel_bodies", ["--old", "kernels", "--shape", "1,2"], "--shape must be four positive integers"),
    ("bench.kernel_bodies", ["--old", "kernels", "--shape", ""], "--shape must be four positive integers"),
    ("bench.kernel_bodies", ["--old", "kernels", "--shape", "a,b,c,d"], "--shape must be four positive integers"),
    ("bench.kernel_bodies", ["--old", "kernels", "--shape", "0,96,80,16"], "--shape must be four positive integers"),
    ("bench.kernel_bodies", ["--old", "kernels", "--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.launch_profile", ["--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.launch_profile", ["--timeout", "-1"], "--timeout must be a finite number > 0"),
    ("bench.launch_profile", ["--timeout", "nan"], "--timeout must be a finite number > 0"),
    ("bench.launch_profile", ["--tuning", "nope=1"], "--tuning: each item must be name=value"),
    ("bench.launch_profile", ["--tuning", "garbage"], "--tuning: each item must be name=value"),
    ("bench.one_launch", ["--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.one_launch", ["--repeats", "0"], "--repeats must be >= 1"),
    ("bench.one_launch", ["--sweep-formats", "nope"], "--sweep-formats must be a comma-separated list"),
    ("bench.one_launch", ["--no-sweep", "--sweep-formats", "affine4"], "--no-sweep and --sweep-formats exclude"),
    ("bench.real_model", ["--backends", "nope"], "--backends must be a comma-separated list"),
    ("bench.real_model", ["--tokens", "0"], "--tokens must be >= 1"),
    ("bench.real_model", ["--layer", "99"], "--layer must be in 0..29"),
    ("bench.real_model", ["--layer", "-1"], "--layer must be in 0..29"),
    ("bench.real_model", ["--shapes", "nope"], "--shapes must be a comma-separated list"),
    ("bench.real_model", ["--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.sanitize", ["--tools", "nope"], "--tools must be a comma-separated list"),
    ("bench.sanitize", ["--shapes", "nope"], "--shapes must be a comma-separated list"),
    ("bench.sanitize", ["--jobs", "0"], "--jobs must be >= 1"),
    ("bench.sanitize", ["--timeout", "-1"], "--timeout must be a finite number > 0"),
    ("bench.sanitize", ["--one-launch-nt", "33"], "--one-launch-nt must be a multiple of 32"),
    ("bench.sass_counts", ["--old", "{d}/missing"], "--old must be a kernels folder"),
    ("bench.sass_counts", ["--formats", "nope"], "--formats must be a comma-separated list"),
    ("bench.sass_counts", ["--jobs", "0"], "--jobs must be >= 1"),
    ("bench.sass_counts", ["--arch", "nope"], "--arch must name a GPU architecture"),
    # the notebook tools: every malformed notebook is named, with what is wrong with it
    *[
        (tool, [*pre, "{d}/" + f], what)
        for tool, pre in (
            ("tools.normalize_notebooks", []),
            ("tools.normalize_notebooks", ["--check"]),
            ("tools.report", ["--out", "{d}/report"]),
        )
        for f, what in (
            ("binary.ipynb", "not a notebook: not UTF-8 text"),
            ("not_json.ipynb", "not a notebook: not JSON"),
            ("list.ipynb", "not a notebook: its JSON is a list"),
            ("empty.ipynb", "the file is empty"),
            ("no_cells.ipynb", "not a notebook: no 'cells'"),
            ("cells_int.ipynb", "'cells' must be a list of cell objects"),
            ("cell_no_source.ipynb", "fails nbformat's schema"),
            ("nbformat3.ipynb", "nbformat 3; these tools read version 4"),
            ("missing.ipynb", "no such file"),
            ("folder", "no such file"),
        )
    ],
    ("tools.report", ["--out", "{d}/a_file", "notebooks/01_hadamard_fold.ipynb"], "--out {d}/a_file: is a file"),
    ("tools.carry_parts", ["split", "{d}/missing", "{d}/parts"], "src: must be a readable file"),
    ("tools.carry_parts", ["split", "{d}/a_file", "{d}/parts", "--parts", "0"], "parts: must be an integer >= 1"),
    ("tools.carry_parts", ["keep", "{d}/missing", "{d}/store"], "No such file or directory"),
    ("tools.carry_parts", ["join", "{d}/missing", "{d}/joined"], "store: no parts kept"),
]

#: The child: each case in this one process (so ~130 cases cost one interpreter's start),
#: the bench commands through their entry point ``bench.common.cli.run``, as ``python -m``
#: runs them; each case's exit status and last line of stderr printed as one JSON line. A
#: case still running after 60 s was accepted (it is measuring) and counts as a failure.
_COMMAND_CHILD = r"""
import contextlib, importlib, io, json, signal, sys, traceback
from bench.common import cli
cases = json.loads(sys.stdin.read())
class Accepted(Exception): pass
def accepted(*_): raise Accepted()
signal.signal(signal.SIGALRM, accepted)
for module, argv in cases:
    err, out = io.StringIO(), io.StringIO()
    signal.alarm(60)
    leak = None
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            main = importlib.import_module(module).main
            try:  # argparse's usage errors are a SystemExit, as they are under python -m
                rc = cli.run(main, argv, prog="python -m " + module) if module.startswith("bench.") else main(argv)
            except SystemExit as e:
                rc = e.code
    except Accepted:
        rc, leak = None, "accepted: still running after 60 s"
    except BaseException as e:
        rc, leak = None, "".join(traceback.format_exception_only(type(e), e)).strip()
    finally:
        signal.alarm(0)
    lines = err.getvalue().strip().splitlines()
    print(json.dumps({"rc": rc, "leak": leak, "last": lines[-1] if lines else "", "stderr": err.getvalue()[-3000:]}),
          flush=True)
"""


@pytest.fixture(scope="module")
def command_outcomes(tmp_path_factory) -> dict[int, dict]:
    """Every command case's outcome, run in one child process (a crash there fails every case)."""
    d = tmp_path_factory.mktemp("commands")
    _command_files(d)
    cases = [(m, [a.replace("{d}", str(d)) for a in argv]) for m, argv, _ in COMMAND_CASES]
    r = subprocess.run(
        [sys.executable, "-c", _COMMAND_CHILD],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=ROOT,
    )
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert r.returncode == 0 and len(rows) == len(cases), (r.returncode, r.stderr[-3000:])
    return {"dir": str(d), **dict(enumerate(rows))}


def command_verdict(outcome: dict, expected: str) -> str:
    """``clear`` (non-zero exit, the expected words in the last line of stderr, no traceback),
    ``unclear`` (refused, but not in those words) or ``other`` (accepted, leaked, crashed)."""
    if outcome["leak"] is not None or outcome["rc"] in (0, None) or "Traceback" in outcome["stderr"]:
        return "other"
    return "clear" if expected in outcome["last"] else "unclear"


@pytest.mark.parametrize(
    "i",
    range(len(COMMAND_CASES)),
    ids=[f"{m.split('.')[-1]} {' '.join(a)}".replace("{d}/", "") for m, a, _ in COMMAND_CASES],
)
def test_a_command_refuses_bad_input_in_one_line(command_outcomes, i):
    module, argv, expected = COMMAND_CASES[i]
    outcome = command_outcomes[i]
    expected = expected.replace("{d}", command_outcomes["dir"])
    assert command_verdict(outcome, expected) == "clear", (module, argv, expected, outcome)


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["-m", "bench.wait_price", "--out-dir", "{d}/a_file"],
            "python -m bench.wait_price: error: argument --out-dir",
        ),
        (["-m", "bench.kernel_plot", "{d}/binary.json"], "python -m bench.kernel_plot: error: record:"),
        (["tools/normalize_notebooks.py", "{d}/binary.ipynb"], "python tools/normalize_notebooks.py: error:"),
        (["tools/report.py", "--out", "{d}/report", "{d}/not_json.ipynb"], "python tools/report.py: error:"),
    ],
)
def test_commands_run_as_a_user_runs_them_end_in_one_line(tmp_path, argv, message):
    """The same through ``python -m`` / ``python tools/X.py``: the entry points are wired."""
    _command_files(tmp_path)
    r = subprocess.run(
        [sys.executable, *[a.replace("{d}", str(tmp_path)) for a in argv]],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert (
        r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.strip().splitlines()[-1].startswith(message)
    ), r.stderr[-2000:]


@pytest.mark.parametrize("path", sorted((ROOT / "bench").glob("*.py")), ids=lambda p: p.stem)
def test_every_bench_command_runs_through_the_one_line_entry_point(path):
    """A command added later gets the same rule: its ``__main__`` is ``bench.common.cli.run``,
    which turns a refusal into one line and a non-zero exit (and is what the cases above run)."""
    import ast

    if path.name == "__init__.py":
        pytest.skip("the package, not a command")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    mains = [n for n in tree.body if isinstance(n, ast.If) and "__main__" in ast.unparse(n.test)]
    assert mains and "cli.run(main" in ast.unparse(mains[-1]), (
        f"{path.name}: __main__ must be sys.exit(cli.run(main, ...))"
    )


def test_the_report_names_a_notebook_whose_cell_raises(tmp_path):
    """``tools/report.py --execute``: a cell that raises ends in one line naming the notebook
    and the error, not nbconvert's page of the cell's traceback."""
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "raises.ipynb")
    r = subprocess.run(
        [
            sys.executable,
            "tools/report.py",
            "--execute",
            "--out",
            str(tmp_path / "report"),
            str(tmp_path / "raises.ipynb"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert last.endswith("raises.ipynb: a cell raised ZeroDivisionError: division by zero"), last
    assert not (tmp_path / "report" / "raises.html").exists()


def test_a_full_disk_at_the_record_loses_no_measurement(tmp_path, monkeypatch, capsys):
    """The record's write fails (ENOSPC): one line naming the file, exit 2, the record's JSON printed whole."""
    import errno

    from bench import wait_price
    from bench.common import cli
    from workbench import files

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_atomic", full)
    rc = cli.run(
        wait_price.main, ["--out-dir", str(tmp_path), "--n", "10", "--warmup", "0"], prog="python -m bench.wait_price"
    )
    out, err = capsys.readouterr()
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "No space left on device" in err
    assert str(tmp_path) in err and "its JSON is printed above" in err
    printed = json.loads(out[out.index("{") : out.rindex("}") + 1])
    assert printed["bench"] == "wait_price" and printed["n"] == 10 and not list(tmp_path.iterdir())


# --- Public calls that read a file, or check arrays against each other: a ValueError naming it ---

BAD_FILES = {
    "binary": bytes(range(256)),
    "not JSON": b"{",
    "empty": b"",
    "a list": b"[]",
    "an object": b'{"a": 1}',
    "UTF-8 BOM then binary": b"\xef\xbb\xbf\xff\xfe",
}


def _readers():
    from workbench import files
    from workbench.reports import records
    from workbench.waits import ledger, plan

    return {
        "load_model": load_model,
        "load_plan": plan.load_plan,
        "load_ledger": ledger.load_ledger,
        "update_json": lambda p: files.update_json(p, lambda old: old),
        "records.load": lambda p: records.load("schedule_run", p.name, p.parent),
    }


@pytest.mark.parametrize("reader", sorted(_readers()))
@pytest.mark.parametrize("content", sorted(BAD_FILES))
def test_a_public_reader_refuses_a_bad_file_naming_it(tmp_path, reader, content):
    """No JSONDecodeError, UnicodeDecodeError or KeyError escapes: a ValueError whose
    message names the file."""
    p = tmp_path / "bad.json"
    p.write_bytes(BAD_FILES[content])
    if reader == "update_json" and content in ("an object", "a list"):
        pytest.skip("valid JSON is what update_json reads; its change judges the content")
    with pytest.raises(ValueError) as err:
        _readers()[reader](p)
    assert "bad.json" in str(err.value), str(err.value)
    assert type(err.value).__name__ not in ("JSONDecodeError", "UnicodeDecodeError"), repr(err.value)


@pytest.mark.parametrize("loader", ["schedule_run", "sanitize"])
def test_load_records_of_a_missing_folder_names_it(tmp_path, loader):
    import importlib

    mod = importlib.import_module(f"workbench.reports.{loader}")
    with pytest.raises(ValueError, match="no_such_folder"):
        mod.load_records(tmp_path / "no_such_folder")


GDN_ARRAYS = ("mixed", "z", "ba", "conv_state", "conv_w", "a_log", "dt_bias", "o_norm", "state")


def _gdn_names(name: str) -> bool:
    """``gdn_step`` with ``name``'s last axis one too long refuses it naming ``name``
    (BackendUnavailable, where the emulator's compiler is absent, is left to propagate)."""
    from workbench.kernels import gdn_step as G

    hk, hv, dk, dv, kw = 1, 2, 32, 8, 4
    c = 2 * hk * dk + hv * dv
    shapes = {
        "mixed": (c,),
        "z": (hv * dv,),
        "ba": (2 * hv,),
        "conv_state": (kw - 1, c),
        "conv_w": (kw, c),
        "a_log": (hv,),
        "dt_bias": (hv,),
        "o_norm": (dv,),
        "state": (hv, dv, dk),
    }
    arrays = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    arrays[name] = np.zeros(shapes[name][:-1] + (shapes[name][-1] + 1,), np.float32)
    try:
        G.gdn_step(**arrays, k_heads=hk, eps=1e-6, backend="metal-emulated")
    except ValueError as err:
        return name in str(err)
    return False


@pytest.mark.parametrize("name", GDN_ARRAYS)
def test_gdn_step_names_the_array_whose_last_axis_is_wrong(name):
    """One array at a time one element longer: the message names THAT array (Hv is read
    from a_log and Dv from o_norm, so a message about another array, or about a derived
    head dim, sends the user to the wrong place)."""
    from workbench.backends import BackendUnavailable

    try:
        assert _gdn_names(name)
    except BackendUnavailable as e:
        pytest.skip(str(e))


# --- Left from the numeric API: a model's name or any object where a config goes; a table described in one line ---

NOT_CONFIGS = ["bonsai-27b", None, 3, {}, ["bonsai-27b"]]


def _wait_calls():
    from workbench.waits import plan as waits

    return {
        "waits_per_token": lambda c: waits.waits_per_token(c, 1),
        "wait_table": lambda c: waits.wait_table(c),
        "eligible_layers": lambda c: waits.eligible_layers(c),
        "split_kinds": lambda c: waits.split_kinds(c, 2),
        "waits_by_rule": lambda c: waits.waits_by_rule(c, 1),
        "submissions": lambda c: waits.submissions(c, 1),
    }


@pytest.mark.parametrize("call", sorted(_wait_calls()))
@pytest.mark.parametrize("cfg", NOT_CONFIGS, ids=repr)
def test_the_wait_plan_refuses_what_is_not_a_config(call, cfg):
    """An AttributeError ('str' object has no attribute 'attention_layers') was the answer."""
    with pytest.raises(ValueError, match=r"^cfg: must be a ModelConfig") as err:
        _wait_calls()[call](cfg)
    if cfg == "bonsai-27b":
        assert "load_model('bonsai-27b')" in str(err.value).split("got")[-1]


def test_load_plan_refuses_what_is_not_a_path():
    from workbench.waits import plan as waits

    for bad in (3, ["a"], b"plan.json"):
        with pytest.raises(ValueError, match="^path: must be None or a plan file's path"):
            waits.load_plan(bad)


def test_a_table_passed_where_numbers_go_is_described_in_one_line():
    """calibrate_tolerance(sweep_frame) printed 12 lines: the describer read the frame's
    ``dtype`` column as if it were the frame's dtype."""
    import pandas as pd

    from workbench import calibrate_tolerance
    from workbench.validate import describe

    frame = pd.DataFrame({"worst": [1e-6, 2e-6], "dtype": ["float32", "bfloat16"]})
    assert describe(frame) == "a DataFrame of shape (2, 2)"
    with pytest.raises(ValueError) as err:
        calibrate_tolerance(frame)
    assert "\n" not in str(err.value) and str(err.value).startswith("errors:"), str(err.value)


# --- The newer surfaces (the check's forms, parts and records): bad input refused naming its parameter ---


def _fake_model() -> object:
    """An object with ``.layers`` and ``.args`` that is not an mlx-lm model."""
    import types

    return types.SimpleNamespace(layers=[1, 2], args=3)


def _tiny_hybrid(n_kv: int = 1):
    """A tiny Bonsai-pattern hybrid's weights and schedule (hidden 32): cheap on a CPU."""
    from workbench.decode.schedule import Schedule
    from workbench.decode.state import HybridWeights

    g = Geometry(
        hidden=32,
        ffn=48,
        n_q=4,
        n_kv=n_kv,
        head_dim=8,
        attn_output_gate=True,
        gdn_k_heads=1,
        gdn_v_heads=2,
        gdn_k_dim=8,
        gdn_v_dim=8,
        conv_kernel=4,
        vocab=64,
    )
    w = HybridWeights(load_model("bonsai-27b"), g, seed=3)
    return w, Schedule(load_model("bonsai-27b"), w)


def _in_fused_tails(model, weights) -> None:
    from workbench.real_models.fused_layers import fused_tails

    with fused_tails(model, weights):
        pass


def _tail_launch():
    from workbench import tail as T

    w = T.TailWeights.random(32, 32, 64, seed=0, fold_block=16)
    br, res = T.random_inputs(w, seed=1)
    return w, T.tail_launch(w), br, res


def _head(hidden_width: int = 64, norm_width: int = 64, k_width: int = 64):
    from workbench.fold.weights import WeightMatrix
    from workbench.kernels.head import head_launch

    q = WeightMatrix(np.ones((32, 64), np.float32))
    k = WeightMatrix(np.ones((16, k_width), np.float32))
    v = WeightMatrix(np.ones((16, 64), np.float32))
    return head_launch(mx.ones(hidden_width), np.ones(norm_width), 1e-6, q, k, v, "metal")


def _tiny_llama_parts():
    """A two-layer mlx-lm Llama (hidden 64), its checkpoint and its captured layers."""
    from tests.test_checkpoint import TOKENS, tiny_llama
    from workbench.real_models.capture import capture_layers
    from workbench.real_models.checkpoint import load_checkpoint

    model = tiny_llama(0)
    return model, load_checkpoint(model), capture_layers(model, TOKENS)


def _kernel_errors(**kw):
    from workbench.real_models.end_to_end import kernel_errors

    _, ckpt, caps = _tiny_llama_parts()
    return kernel_errors(ckpt, caps, **{"backend": "graph", **kw})


def _run_stages(**kw):
    from bench.common.stages import run_stages

    _, sched = _tiny_hybrid()
    return run_stages(sched, **{"tokens": 1, "rounds": 1, "warmup": 0, "context": 1, **kw})


def _gguf_with_too_few_blocks(folder: Path) -> Path:
    """A GGUF whose tensors are two layers' and whose ``llama.block_count`` says 1."""
    from tests.test_checkpoint import tiny_llama, write_gguf

    model = tiny_llama(0)
    model.args.num_hidden_layers = 1  # what write_gguf writes as llama.block_count
    return write_gguf(model, folder / "two_layers.gguf")


def _newer_cases(folder: Path) -> list[tuple[str, Callable[[], Any], str]]:
    """(label, call, the regex its error must START with): the issue's unclear errors, each now a
    ValueError naming the parameter, what was given and what is allowed."""
    from workbench.decode.geometry import geometry_of
    from workbench.decode.state import new_state
    from workbench.kernels import run as KR
    from workbench.kernels.launch import prepare_tail
    from workbench.real_models.capture import capture_layers
    from workbench.real_models.checkpoint import load_checkpoint
    from workbench.real_models.model_parts import vocab_size
    from workbench.real_models.tokenizer import gguf_tokenizer
    from workbench.reports.schedule_run import kernel_records

    w, launch, br, res = _tail_launch()
    ones40 = np.ones(40, np.float32)
    model = "model: must be an mlx-lm model"
    return [
        ("load_checkpoint(.layers and .args)", lambda: load_checkpoint(_fake_model()), "source: must be an mlx-lm"),
        ("capture_layers(.layers and .args)", lambda: capture_layers(_fake_model(), [1]), model),
        ("fused_tails(.layers and .args)", lambda: _in_fused_tails(_fake_model(), [None, None]), model),
        ("vocab_size(.layers and .args)", lambda: vocab_size(_fake_model()), model),
        ("fused_tails(model, None)", lambda: _in_fused_tails(_tiny_llama_parts()[0], None), "weights: must be a"),
        ("kernel_records(None)", lambda: kernel_records(None), "records: must be a sequence"),
        ("kernel_records(a record)", lambda: kernel_records({"matvec": "kernels"}), "records: must be a sequence"),
        ("run_tail branch of 40", lambda: KR.run_tail("metal", launch, ones40, res), "branch: must be an array"),
        ("run_tail residual of 40", lambda: KR.run_tail("metal", launch, br, ones40), "residual: must be an array"),
        (
            "run_kernel_tail branch of 40",
            lambda: KR.run_kernel_tail("metal-emulated", launch, ones40, res),
            "branch: must be an array whose last axis is 32",
        ),
        (
            "kernel_tail branch of 40",
            lambda: KR.kernel_tail(launch, mx.array(ones40), mx.array(res), "metal"),
            "branch: must be an array whose last axis is 32",
        ),
        (
            "run_cuda_tail batch of 2 vs 1",
            lambda: KR.run_cuda_tail(launch, np.stack([br, br]), res[None]),
            "residual: must have the branch's leading",
        ),
        ("run_tail(launch=weights)", lambda: KR.run_tail("metal", w, br, res), "launch: must be a TailLaunch"),
        ("head_launch hidden 32", lambda: _head(hidden_width=32), "hidden: must be one position of width 64"),
        ("head_launch attn_norm 32", lambda: _head(norm_width=32), "attn_norm: must be one position of width 64"),
        ("head_launch k of width 32", lambda: _head(k_width=32), "k: must have q's in dimension 64"),
        (
            "Schedule.step(a state of other weights)",
            lambda: _tiny_hybrid()[1].step(new_state(_tiny_hybrid(n_kv=2)[0], context=1, max_new=2), 1),
            "state: made for other weights",
        ),
        ("gguf_tokenizer(None)", lambda: gguf_tokenizer(None), "metadata: must be a GGUF file's metadata"),
        (
            "gguf_tokenizer without tokens",
            lambda: gguf_tokenizer({"tokenizer.ggml.model": "gpt2"}),
            "metadata: tokenizer.ggml.tokens must be a list",
        ),
        ("prepare_tail(tuning='fast')", lambda: prepare_tail(launch, "metal", tuning="fast"), "tuning: must be a"),
        ("prepare_tail(weights)", lambda: prepare_tail(w, "metal"), "launch: must be a TailLaunch"),
        ("geometry_of('bonsai-27b')", lambda: geometry_of("bonsai-27b"), r"cfg: must be a ModelConfig"),
        ("geometry_of(vocab=0)", lambda: geometry_of(load_model("bonsai-27b"), vocab=0), "vocab: must be an integer"),
        ("kernel_errors(positions=())", lambda: _kernel_errors(positions=()), "positions: must hold at least one"),
        ("kernel_errors(positions=(99,))", lambda: _kernel_errors(positions=(99,)), "positions: must be an integer"),
        ("kernel_errors(positions='0')", lambda: _kernel_errors(positions="0"), "positions: must be a sequence"),
        ("kernel_errors(backend='tpu')", lambda: _kernel_errors(backend="tpu"), "backend: must be one of"),
        ("kernel_errors(ckpt=None)", lambda: _kernel_errors_of(None), "ckpt: must be a Checkpoint"),
        ("run_stages(tokens=10**7)", lambda: _run_stages(tokens=10**7), r"tokens: must be an integer >= 1 and <="),
        ("run_stages(warmup=10**7)", lambda: _run_stages(warmup=10**7), r"warmup: must be an integer >= 0 and <="),
        ("run_stages(stages='12')", lambda: _run_stages(stages="12"), "stages: must be a sequence"),
        ("run_stages(stages=[99])", lambda: _run_stages(stages=[99]), r"stages\[0\]: 99 is not a stage"),
        ("compile_source(42)", lambda: _compile_source(42), "source: must be MLX's generated Metal source"),
        (
            "a GGUF of two layers with block_count 1",
            lambda: load_checkpoint(_gguf_with_too_few_blocks(folder)),
            r"source: GGUF file two_layers\.gguf: the GGUF metadata's 'llama\.block_count' must be at least 2",
        ),
    ]


def _compile_source(source):
    from workbench.kernels.metal_emulation import compile_source

    return compile_source(source)


@pytest.mark.skipif(shutil.which("clang++") is None, reason="the emulator's compile cache is used only with clang++")
@pytest.mark.parametrize("what", ["a file", "a folder where the object goes"])
def test_an_unusable_compile_cache_is_named(tmp_path, monkeypatch, what):
    """A cache path that is a file, or one holding a folder where a compiled kernel goes, is
    refused naming the setting and the path, not with a bare OSError."""
    import mlx.core as mx

    from workbench.kernels import metal_toolchain
    from workbench.kernels.metal_drop_in import metal_kernel

    cache = tmp_path / "cache"
    if what == "a file":
        cache.write_text("not a folder")
    monkeypatch.setenv("WORKBENCH_METAL_EMULATION_CACHE", str(cache))
    source = f"uint i = thread_position_in_grid.x;\nout[i] = inp[i] + {len(what)}.0f;  // {tmp_path.name}\n"
    k = metal_kernel(name=f"cache_{len(what)}", input_names=["inp"], output_names=["out"], source=source)
    if what != "a file":  # every object the cache would hold is a folder already
        real_cached = metal_toolchain._cached

        def cached(target, build):
            target.mkdir(parents=True, exist_ok=True)
            return real_cached(target, build)

        monkeypatch.setattr(metal_toolchain, "_cached", cached)
    x = mx.arange(8, dtype=mx.float32)
    with pytest.raises(ValueError, match=r"^\$WORKBENCH_METAL_EMULATION_CACHE: the emulator's compile cache .* cannot"):
        k(inputs=[x], grid=(8, 1, 1), threadgroup=(8, 1, 1), output_shapes=[(8,)], output_dtypes=[mx.float32])


def _kernel_errors_of(ckpt):
    from workbench.real_models.end_to_end import kernel_errors

    return kernel_errors(ckpt, _tiny_llama_parts()[2], backend="graph")


NEWER_LABELS = [label for label, _, _ in _newer_cases(Path("."))]


def _refused_as(call: Callable[[], Any], start: str) -> str:
    """``clear`` when ``call()`` raises a ValueError whose message starts with ``start`` (a regex),
    else what happened instead (for the assertion's message)."""
    try:
        call()
    except ValueError as err:
        return "clear" if re.match(start, str(err)) else f"unclear: {err}"
    except Exception as err:  # any other type escaping is the failure reported
        return f"leaked {type(err).__name__}: {err}"
    return "accepted"


@pytest.mark.parametrize("label", NEWER_LABELS)
def test_the_newer_surfaces_refuse_bad_input_naming_the_parameter(tmp_path, label):
    (call, start) = next((c, s) for lbl, c, s in _newer_cases(tmp_path) if lbl == label)
    assert _refused_as(call, start) == "clear", label


# --- The tally by surface: tried / a clear error (or the correct result) / anything else ---


def _clear(call, pattern: str) -> bool:
    """``call()`` raises a ValueError whose message matches ``pattern`` (re.search)."""
    import re

    try:
        call()
    except ValueError as err:
        return re.search(pattern, str(err)) is not None
    except Exception:
        return False
    return False


def tally(command_outcomes: dict, folder: Path) -> dict[str, tuple[int, int]]:
    """Per surface, (cases tried, cases answered with a clear error): the same tables the
    tests above run, counted in one place for the issue's closing note."""
    from workbench.validate import token_ids

    def file_with(name: str, data: bytes) -> Path:
        p = folder / name
        p.write_bytes(data)
        return p

    out: dict[str, list[bool]] = {}
    out["GGUF header"] = [
        _clear(lambda b=b: check_gguf_header(file_with("t.gguf", b)), r"^source: GGUF file t\.gguf")
        for b in CORRUPT.values()
    ]
    out["safetensors header"] = [
        _clear(lambda b=b: check_safetensors_header(file_with("t.safetensors", b)), r"^source: safetensors file")
        for b in SAFETENSORS_BAD
    ]
    fields = {f: getattr(CPU_GEOMETRY, f) for f in CPU_GEOMETRY.__dataclass_fields__}
    out["decode Geometry eps"] = [_clear(lambda e=e: Geometry(**{**fields, "eps": e}), "^eps:") for e in BAD_EPS]
    out["token ids"] = [_clear(lambda t=t: token_ids("tokens", t, 49152), "^tokens: must") for t, _ in BAD_TOKENS]
    readers = _readers()
    out["public file readers"] = [
        _clear(lambda r=r, c=c: readers[r](file_with("bad.json", BAD_FILES[c])), "bad.json")
        for r in readers
        for c in BAD_FILES
        if not (r == "update_json" and c in ("an object", "a list"))
    ]
    from workbench.backends import BackendUnavailable

    try:  # the emulator's compiler absent: that surface is not tried here
        out["gdn_step shapes"] = [_gdn_names(name) for name in GDN_ARRAYS]
    except BackendUnavailable:
        pass
    out["newer surfaces"] = [_refused_as(call, start) == "clear" for _, call, start in _newer_cases(folder)]
    from tests.test_robustness_integrity import cases as integrity_cases
    from tests.test_robustness_integrity import refused_as

    out["check guards, processes, replay"] = [refused_as(c, s) == "clear" for _, c, s in integrity_cases(folder)]
    out["wait plan: not a config"] = [
        _clear(lambda f=f, c=c: f(c), "^cfg: must be a ModelConfig")
        for f in _wait_calls().values()
        for c in NOT_CONFIGS
    ]
    for i, (module, _, expected) in enumerate(COMMAND_CASES):
        surface = module.replace("tools.", "tools/") if module.startswith("tools.") else module
        out.setdefault(surface, []).append(
            command_verdict(command_outcomes[i], expected.replace("{d}", command_outcomes["dir"])) == "clear"
        )
    counts = {k: (len(v), sum(v)) for k, v in out.items()}
    from tests.check_command_cases import tally_rows

    try:  # `python -m workbench.check` and its calls (their own file); without the emulator's compiler: not tried
        counts.update(tally_rows())
    except BackendUnavailable:
        pass
    return counts


def test_tally_by_surface(command_outcomes, tmp_path):
    """Printed (``pytest -s``) for the closing note; every case a clear error, none anything else."""
    counts = tally(command_outcomes, tmp_path)
    lines = [f"{'surface':<28} {'tried':>6} {'clear':>6} {'other':>6}"]
    lines += [f"{k:<28} {n:>6} {c:>6} {n - c:>6}" for k, (n, c) in sorted(counts.items())]
    n_all, c_all = sum(n for n, _ in counts.values()), sum(c for _, c in counts.values())
    lines.append(f"{'all':<28} {n_all:>6} {c_all:>6} {n_all - c_all:>6}")
    print("\n" + "\n".join(lines))
    assert n_all >= 200 and c_all == n_all, "\n".join(lines)
