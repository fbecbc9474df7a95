"""The kernel tail's benchmark: kernels against the MLX graph, the unfused tail and PyTorch.

    python -m bench.kernel_bench                 # Bonsai-27B, bf16 and every quantized format, on this GPU
    python -m bench.gpu_check                    # the checks AND this benchmark, one record

At Bonsai-27B's tail (hidden 5120, branch 6144, ffn 17408; wo folded with block 1024),
side by side in one run and interleaved round by round:

* resident (inputs already on the device, one evaluation = one wait, timed from submit
  to result): the MLX graph (``tail.tail_graph``), the kernel tail (three launches in one
  evaluation), PyTorch eager and PyTorch replaying a CUDA graph of the same five ops
  (bf16 weights; PyTorch's matvec needs its vector in the weights' dtype, so its
  activations are bf16: its error against the float64 oracle is recorded beside it);
* end to end, as the engine runs a layer (branch and residual from the host, the result
  back to the host): the unfused tail (two waits), the graph and the kernels through
  ``tail.fused_tail``, and the kernels' path split into its parts (making the inputs,
  the evaluation, the read back);
* device time: 10 tails in one evaluation, per tail (no per-wait overhead), and each
  launch alone the same way, with its bandwidth;

against the floor: weight bytes over the copy bandwidth measured in the same run
(PyTorch's device-to-device copy, bytes read plus written; MLX's ``x + 1`` beside it).
The same again with each quantized format the kernels read (:data:`BENCH_FORMATS`:
affine 4- and 8-bit group 64, mxfp4, nvfp4; MLX's layouts), where PyTorch has no
matching matvec and is left out; each against its own floor (codes + scales bytes).

The benchmark itself is ``bench.common.kernel_tail``, which ``bench.gpu_check`` also runs
and records.
"""

from __future__ import annotations

import datetime as _dt
import sys

from bench.common import cli
from bench.common import record
from bench.common.kernel_tail import print_table, run
from bench.common.kernels import BENCH_FORMATS
from workbench import backends


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser("kernel_bench", __doc__)
    ap.add_argument("--repeats", type=int, default=50, help="timed rounds per variant")
    ap.add_argument("--quick", action="store_true", help="no tuning sweep")
    ap.add_argument("--formats", default=",".join(BENCH_FORMATS),
                    help=f"comma list of quantized formats after bf16 (default {','.join(BENCH_FORMATS)})")
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
        record.write({"what": "kernel tail benchmark: every weight format against its floor", **prov,
                      "dialect": dialect, "bench": bench},
                     a.out_dir, record.record_stem("kernel_bench", device, started), force=a.force)
    return 0


if __name__ == "__main__":
    sys.exit(cli.run(main, prog="python -m bench.kernel_bench"))
