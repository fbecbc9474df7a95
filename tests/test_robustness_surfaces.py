"""The surfaces added after the numeric API answer bad input with a clear error, never a crash.

Checkpoint files (GGUF headers, safetensors headers, config.json), a checkpoint's metadata
against its tensors, ``load_model`` given a path, the decode schedule's geometry and its
step past the end. A corrupt file is loaded in a child process, so a segfault or an abort
fails the test instead of ending the run: the child must exit 0 having seen a ValueError
that names the file.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

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


def gguf_bytes(*, n_tensors: int | None = None, n_kv: int | None = None, key_len: int | None = None,
               n_dims: int = 2, dims: tuple[int, ...] = (32, 4), ttype: int = 0, offset: int = 0,
               data: int | None = None) -> bytes:
    """A GGUF v3 file with one key/value and one F32 tensor, fields overridable (the spec's layout)."""
    kv = (struct.pack("<Q", key_len) if key_len is not None else b"") + (
        b"general.architecture"[: key_len] if key_len is not None and key_len < 100 else b"")
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


@pytest.mark.parametrize("blob", [
    b"", b"\1\2", struct.pack("<Q", 1 << 40) + b"{}",
    _safetensors(b"\xff\xfe{", b""), _safetensors(b"[1, 2]", b""), _safetensors(b"{not json", b""),
    _safetensors({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, bytes(10)),
    _safetensors({"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 60]}}, bytes(64)),
    _safetensors({"w": {"dtype": "Q9", "shape": [4], "data_offsets": [0, 16]}}, bytes(16)),
    _safetensors({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}}, bytes(16)),
    _safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 0]}}, bytes(16)),
    _safetensors({"w": [1]}, bytes(16)),
])
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
    raw = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, num_attention_heads=0,
               num_key_value_heads=1, intermediate_size=128, rms_norm_eps=1e-6, hidden_act="silu")
    with pytest.raises(ValueError, match="num_attention_heads"):
        MF.from_hf_config(raw)


def test_load_model_takes_a_config_path_and_names_the_alternative():
    assert load_model(Path("data/models/bonsai-27b.json").resolve()).hidden_size == load_model("bonsai-27b").hidden_size
    with pytest.raises(ValueError, match="config.json's path.*load_checkpoint"):
        load_model("no-such-model")


@pytest.mark.parametrize("eps", [float("nan"), -1e-6, 0.0, float("inf"), "1e-6", True])
def test_geometry_refuses_a_bad_eps(eps):
    fields = {f: getattr(CPU_GEOMETRY, f) for f in CPU_GEOMETRY.__dataclass_fields__}
    with pytest.raises(ValueError, match="^eps:"):
        Geometry(**{**fields, "eps": eps})


def test_schedule_step_past_its_caches_and_with_a_bad_state_is_clear():
    from workbench.decode.schedule import Schedule
    from workbench.decode.state import HybridWeights, new_state

    cfg = load_model("bonsai-27b")
    tiny = Geometry(hidden=32, ffn=48, n_q=4, n_kv=1, head_dim=8, attn_output_gate=True, gdn_k_heads=1,
                    gdn_v_heads=2, gdn_k_dim=8, gdn_v_dim=8, conv_kernel=4, vocab=64)
    w = HybridWeights(cfg, tiny, seed=3)
    sched = Schedule(cfg, w)
    st = new_state(w, context=1, max_new=1)
    sched.step(st, 1)
    with pytest.raises(ValueError, match="^state: its KV caches hold 2 tokens"):
        sched.step(st, 1)
    for bad in (None, 3, "state", {}):
        with pytest.raises(ValueError, match="^state:"):
            sched.step(bad, 1)


@pytest.mark.parametrize("argv, message", [
    (["bench.tail_bench", "--bandwidth-gbps", "0", "--no-record"], "--bandwidth-gbps must be a finite number > 0"),
    (["bench.tail_bench", "--bandwidth-gbps=-1", "--no-record"], "--bandwidth-gbps must be a finite number > 0"),
    (["bench.schedule_run", "--vocab", "0", "--no-record"], "--vocab must be >= 1"),
    (["bench.schedule_run", "--model", "nope", "--no-record"], "--model nope: name: unknown model"),
])
def test_bench_commands_refuse_falsy_and_unknown_values_in_one_line(argv, message):
    """Falsy values are refused, never replaced by a default; the message is one line, no traceback."""
    r = subprocess.run([sys.executable, "-m", *argv], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parent.parent)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("tokens, bad", [([1, 2, 10**6], "10") , ([1, -1], "-1"), ([1, 2.0], "2.0"),
                                         ([True], "True"), ([], "empty"), ("12", "'12'"), (None, "None")])
def test_real_model_helpers_refuse_ids_outside_the_vocabulary(tokens, bad):
    from workbench.validate import token_ids

    with pytest.raises(ValueError, match=r"^tokens: must"):
        token_ids("tokens", tokens, 49152)


def test_smollm2_helpers_refuse_bad_ids_and_an_unbounded_n():
    from workbench.real_models import checkpoint as CK
    from workbench.real_models import reference_model as RM

    try:
        path = CK.smollm2_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    model = RM.reference_model(CK.load_checkpoint(path))
    vocab = RM.vocab_size(model)
    assert vocab == 49152
    for call in (lambda: RM.capture_layers(model, [1, vocab]), lambda: RM.greedy(model, [1, -3], 1),
                 lambda: RM.forced_choices(model, [1, 2.5, 3], 1)):
        with pytest.raises(ValueError, match=r"^(tokens|prompt|sequence): must hold token ids"):
            call()
    with pytest.raises(ValueError, match=r"^n: "):
        RM.greedy(model, [1, 2], 10**9)
    with pytest.raises(ValueError, match=r"^start: "):
        RM.forced_choices(model, [1, 2, 3], 5)
