"""A Hadamard pack's layer at Bonsai-27B's shape, checked in one call: seeds, seconds, peak memory.

The pack is written through mlx-lm 0.32.2's own classes (``workbench.real_models.
hadamard_pack_writer``) at Bonsai-27B's layer geometry (``data/models/bonsai-27b.json``:
hidden 5120, attention branch 24 x 256 = 6144, FFN 17408) as ONE full-attention layer and a
small vocabulary (the tail reads neither the other layers nor the embedding), every linear
2-bit affine at group 128 with float16 scales and its own input rotation at block 1024, then
loaded by ``mlx_lm.utils.load_model``. ``check_pack_tail`` judges mlx-lm's own modules of the
layer (``o_proj``, ``post_attention_layernorm``, the MLP) against the float64 truth of the
same stored codes. Peak memory is the process's maximum resident set (``ru_maxrss``).

    python -m bench.check_bonsai_pack                 # 100 seeds, the rotation and scale faults
    python -m bench.check_bonsai_pack --seeds 10 --no-record
"""

from __future__ import annotations

import resource
import sys
import tempfile
import time
from typing import Any

from bench.common import cli, record
from workbench.check import CallableSubject, check_pack_tail
from workbench.models import load_model, read_pack
from workbench.real_models import block_1024, load_hadamard_pack, write_hadamard_pack
from workbench.tail import pack_tail_weights

#: The fault models run by default: one skipped rotation, one borrowed sign vector, the bf16 scales.
FAULTS = ("rotation_skipped_down", "gate_with_up_signs", "scales_bfloat16")


def bonsai_layer_config() -> dict[str, Any]:
    """Bonsai-27B's text config (the project's note on it) as one full-attention layer, vocabulary 1024."""
    import json

    from workbench.models import MODELS_DIR

    text = dict(json.loads((MODELS_DIR / "bonsai-27b.json").read_text())["text_config"])
    text.update(
        num_hidden_layers=1,
        full_attention_interval=1,
        layer_types=["full_attention"],
        vocab_size=1024,
        rope_parameters={"type": "default", "rope_theta": text["rope_theta"], "partial_rotary_factor": 0.25},
    )
    return text


def _peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # kB on Linux


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = cli.parser("check_bonsai_pack", __doc__)
    p.add_argument("--seeds", type=int, default=100, help="seeds (cases) to check, each at 3 input scales")
    p.add_argument("--all-faults", action="store_true", help="every fault model of check.PACK_FAULTS, not three")
    p.add_argument("--tag", default="", help="appended to the record's file name")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error("--seeds must be >= 1")
    load_model("bonsai-27b")  # the note's geometry, read as the workbench reads it (refused if unreadable)
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        write_hadamard_pack(d, bonsai_layer_config(), blocks=block_1024, seed=0)
        model, _ = load_hadamard_pack(d)
        w = pack_tail_weights(read_pack(d), 0)
        t_write = time.perf_counter() - t0
        layer = model.language_model.model.layers[0]

        def mlx_lm_tail(sc):
            import mlx.core as mx
            import numpy as np

            h = mx.array(sc.residual) + layer.self_attn.o_proj(mx.array(sc.branch))
            return np.array(h + layer.mlp(layer.post_attention_layernorm(h)))

        subject = CallableSubject(mlx_lm_tail, batched=True, name="mlx-lm's modules", process=False)
        t0 = time.perf_counter()
        kw = {} if args.all_faults else {"faults": FAULTS}
        rep = check_pack_tail(subject, w, seeds=range(args.seeds), name="bonsai-27b layer", **kw)
        t_check = time.perf_counter() - t0
    catch = rep.faults.groupby("fault")["worst"].min().to_dict() if rep.faults is not None else {}
    worst = rep.cases.groupby("scale")[["worst", "ref_worst"]].max()
    print(f"shape (hidden, branch, ffn) = {w.shape}, every linear affine2-g128, float16 scales, block 1024")
    print(f"pack written and loaded in {t_write:.1f} s; check of {args.seeds} seeds x 3 scales in {t_check:.1f} s")
    print(f"peak memory (max RSS): {_peak_gib():.2f} GiB")
    print(worst.to_string())
    print("fault models, smallest worst scaled error over the cases:", {k: f"{v:.3g}" for k, v in catch.items()})
    print(f"verdict: {'PASS' if rep.passed else 'FAIL'} {rep.reasons}")
    rec = {
        **record.provenance("check_bonsai_pack", argv),
        "target": "the check at Bonsai-27B's shape in the pack's format over 100 seeds in one call, peak memory stated",
        "notes": "wall time; the machine was shared with other developers' jobs; peak memory is ru_maxrss",
        "results": {
            "shape": list(w.shape),
            "seeds": args.seeds,
            "scales": sorted(set(rep.cases["scale"].tolist())),
            "faults": sorted(catch),
            "write_s": t_write,
            "check_s": t_check,
            "peak_rss_gib": _peak_gib(),
            "worst_by_scale": {str(k): float(v) for k, v in worst["worst"].items()},
            "ref_worst_by_scale": {str(k): float(v) for k, v in worst["ref_worst"].items()},
            "fault_min_worst": {k: float(v) for k, v in catch.items()},
            "verdict": rep.passed,
            "reasons": list(rep.reasons),
        },
    }
    if not args.no_record:
        record.write(rec, args.out_dir, record.record_stem("check_bonsai_pack", tag=args.tag), force=args.force)
    return rec


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.check_bonsai_pack"))
