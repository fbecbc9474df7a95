"""The kernel tail's benchmark: kernels against the MLX graph, the unfused tail and PyTorch.

    python -m bench.kernel_bench                 # Bonsai-27B, bf16 and every quantized format, on this GPU
    python -m bench.gpu_check                    # the checks AND this benchmark, one record

At Bonsai-27B's tail (5120 / 6144 / 17408, wo folded with block 1024), interleaved round by round: one
evaluation with resident inputs (the MLX graph, the kernels, PyTorch eager and its CUDA-graph replay in bf16);
end to end as the engine runs a layer (the unfused tail's two waits, the graph and the kernels through
``tail.fused_tail``, the kernels' path split into its parts); device time (ten tails in one evaluation, and
each launch alone, with its bandwidth). Each against the floor: weight bytes over the copy bandwidth measured
in the same run. Then the same in each quantized format of :data:`BENCH_FORMATS` (no PyTorch: it has no
matching matvec), against its own floor (codes + scales bytes).

Prints tables and writes ``data/bench/kernel_bench-<device>-<UTC time>.json`` unless ``--no-record``; the
benchmark itself is ``bench.common.kernel_tail``, which ``bench.gpu_check`` also runs and records.
"""

from __future__ import annotations

import datetime as _dt
import sys

from bench.common import cli, record
from bench.common.kernel_tail import print_table, run
from bench.common.kernels import BENCH_FORMATS
from workbench import backends


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("kernel_bench", __doc__)
    ap.add_argument("--repeats", type=int, default=50, help="timed rounds per variant")
    ap.add_argument("--quick", action="store_true", help="no tuning sweep")
    ap.add_argument(
        "--formats",
        default=",".join(BENCH_FORMATS),
        help=f"comma list of quantized formats after bf16 (default {','.join(BENCH_FORMATS)})",
    )
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    formats = tuple(cli.comma_list(ap, "--formats", a.formats, BENCH_FORMATS))
    cli.at_least(ap, "--repeats", a.repeats, 1)
    cli.at_least(ap, "--seed", a.seed, 0)
    dialect = "cuda" if backends.cuda_available() else ("metal" if backends.metal_available() else None)
    if dialect is None:
        print("no GPU: the kernel benchmark needs MLX's CUDA or Metal back-end")
        return 2
    prov = record.provenance("kernel_bench", argv)
    started = _dt.datetime.fromisoformat(prov["date"])
    bench = run(dialect, repeats=a.repeats, seed=a.seed, quick=a.quick, formats=formats)
    print_table(bench)
    if not a.no_record:
        device = prov["device"].get("device_name", f"{dialect} GPU")
        record.write(
            {
                "what": "kernel tail benchmark: every weight format against its floor",
                **prov,
                "dialect": dialect,
                "bench": bench,
            },
            a.out_dir,
            record.record_stem("kernel_bench", device, started),
            force=a.force,
        )
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.kernel_bench"))
