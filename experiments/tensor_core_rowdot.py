"""A tensor-core row dot for affine 4-bit weights, beside the kernels' CUDA-core one (CUDA).

    python -m experiments.tensor_core_rowdot                    # gate and up of Bonsai-27B, stacked
    python -m experiments.tensor_core_rowdot --rows 4096 --cols 1024 --repeats 20

Why this exists: the kernels' 4-bit launches stay at 3-4x their floors (docs/JOURNAL.md,
"What was left open"). In the CUDA-core scheme every weight costs a code placement, an exact subtract
and an FMA, and every lane reads its own x from group memory, once a row. This experiment
measures the alternative before any body is rewritten: ``mma.sync`` (m16n8k16, bfloat16
in, float32 accumulators) on one matrix ``y = W x``, W in MLX's affine 4-bit layout
(group 64, bfloat16 scales and biases), against

- the kernels' own row dot on the same matrix (``decode_matvec.matvec_launch``: the
  ``wo_residual`` body with no fold, a plain matvec plus a zero residual), and
- MLX's ``mx.quantized_matmul``,

each checked against the exact dequantized map in float64, then timed (device time a
matvec: ``--chain`` matvecs in one evaluation, median of ``--repeats``), beside the floor
(the weight, scale and bias bytes over the measured copy bandwidth). Default shape:
gate and up of Bonsai-27B's FFN stacked (34816 x 5120), what ``ffn_gate_up`` reads.

How the tensor cores see a 4-bit row (:data:`SOURCE`; :func:`fragment_model` is the same
mapping in numpy, tested on the CPU):

- A warp takes 16 rows at a time (the MMA's M). A quantization group (64 weights, 8 words a
  row) is four MMAs of k = 16: lane (g, t) (g = lane / 4, t = lane % 4) loads words
  2t and 2t + 1 of the group in rows g and g + 8 (8 bytes each: four lanes read a row's 32
  bytes). So every MMA stays inside one group and its scale applies to its sum.
- Because k is summed over, a lane may put its OWN codes into its A fragment in any order,
  as long as its B fragment holds x in the same order. MMA i of a group takes word i / 2,
  nibbles (p, p + 4) into A's slots (2t, 2t + 1) and (p + 1, p + 5) into (2t + 8, 2t + 9),
  p = 2 (i % 2): exactly the two nibbles one mask-and-or puts into a bfloat16 pair
  (``0x4300 | n`` is 128 + n, exactly; one packed subtract of 128 leaves n, exactly).
- B's 8 columns: x split into three bfloat16 parts (hi, mid, lo: 24 significant bits, so
  each product is exact and the three columns sum to q x within float32 rounding) in
  columns 0-2; columns 3-7 zero. Each block writes every lane's B registers for every
  group into group memory once (the prologue), so a lane reads them as two 16-byte loads
  a group (lanes of the zero columns read one zeroed pair, group after group), and one read of x
  serves 16 rows instead of one.
- C: lane (g, 0) holds columns 0 and 1 (the hi and mid sums) of rows g and g + 8, lane
  (g, 1) column 2 (lo). A group's sums are scaled once (scale x (c0 + c1)), the bias
  added once (bias x the group's sum of x, by lane t = 0); lanes t and t ^ 1 are added at
  the end.

Two ways to make the codes MMA inputs, both timed (template value ``SUB``):

- ``bf16``: as above; per pair of codes a shift, one mask-and-or and one packed subtract
  (``HADD2.BF16``, a fifth of the loop's instructions in nvcc's code).
- ``f16 subnormal``: the mask alone. Nibbles n and n + 4 masked in place are the float16
  pair (q_n 2^-24, q_{n+4} 2^-24): subnormal float16s, exact, with nothing to subtract.
  B is then float16 too: x times 2^e (e chosen per evaluation from max |x|, so the
  largest lands in [2^14, 2^15), within float16's range) split into three float16 parts,
  and each group's sum is scaled back by 2^(24 - e), exactly. It holds only if the tensor
  cores take subnormal float16 inputs as they are: were they flushed to zero, every code
  below 2^10 x 2^-24 would read as 0 and the check would fail, which the record then shows.

A record (device, date, MLX version, command) goes to ``data/bench/``. Needs MLX's CUDA
backend (exit 2 without it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import cli, record

#: The folder of this file and of its CUDA source.
HERE = Path(__file__).resolve().parent

#: Rows an MMA tile takes (the instruction's M) and weights a quantization group.
TILE_ROWS = 16
GROUP = 64

#: The kernel body, ``tensor_core_rowdot.cu`` beside this file (MLX's ``mx.fast.cuda_kernel``
#: wraps it in its signature: inputs ``w`` (uint32 codes, [R, K/8]), ``s`` and ``b`` (bfloat16
#: scales and biases, [R, K/64]), ``x`` (float32, [K]); output ``y`` (float32, [R])). Template
#: values: K, R, NT (threads a block), UG (groups whose words a lane loads before using any),
#: SUB (the codes as subnormal float16s, x as float16 parts; else bfloat16).
SOURCE = (HERE / "tensor_core_rowdot.cu").read_text()

#: Helpers the body calls, put in the kernel's header: ``tensor_core_rowdot.cuh``.
HEADER = (HERE / "tensor_core_rowdot.cuh").read_text()


#: The variants' names in the table and the record.
TENSOR_BF16 = "tensor cores, bf16 codes"
TENSOR_F16_SUBNORMAL = "tensor cores, f16 subnormal codes"
CUDA_CORES = "kernels' row dot (CUDA cores)"
MLX_QMM = "mx.quantized_matmul"


def check_shape(rows: int, cols: int, units: int) -> None:
    """Raises ValueError naming the parameter unless the kernel can take the shape: rows a
    multiple of 16 (a tile), cols of 64 (a group) and at most 7,680 (the prologue's B
    registers, 6 bytes an x, fit 48 KB of static shared memory), units dividing the groups."""
    if not isinstance(rows, int) or rows < TILE_ROWS or rows % TILE_ROWS:
        raise ValueError(f"rows must be a positive multiple of {TILE_ROWS} (an MMA tile); got {rows!r}")
    if not isinstance(cols, int) or cols < GROUP or cols % GROUP or cols > 7680:
        raise ValueError(f"cols must be a multiple of {GROUP} (a group) from {GROUP} to 7680; got {cols!r}")
    if not isinstance(units, int) or units < 1 or (cols // GROUP) % units:
        raise ValueError(f"units must be a positive divisor of cols / {GROUP} = {cols // GROUP}; got {units!r}")


def split_bf16(x: np.ndarray) -> np.ndarray:
    """x (float32) as three bfloat16 parts, returned as float32 values [3, n]: hi the
    rounding of x, mid of what hi left, lo of what both left (round to nearest even, as
    ``__float2bfloat16_rn``)."""

    def rn(v: np.ndarray) -> np.ndarray:
        bits = v.astype(np.float32).view(np.uint32).astype(np.uint64)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # round to nearest even
        return bits.astype(np.uint32).view(np.float32)

    x = np.asarray(x, np.float32)
    hi = rn(x)
    r1 = (x - hi).astype(np.float32)
    mid = rn(r1)
    lo = rn((r1 - mid).astype(np.float32))
    return np.stack([hi, mid, lo])


def x_scale_exponent(x: np.ndarray) -> int:
    """The SUB scheme's e: max |x| 2^e in [2^14, 2^15) (float16's range), as the kernel's
    prologue computes it (``frexpf``), kept within [-100, 100]."""
    m = float(np.max(np.abs(x))) if np.size(x) else 0.0
    ex = int(np.frexp(np.float32(m))[1])
    return max(-100, min(100, 15 - ex))


def split_f16(x: np.ndarray) -> np.ndarray:
    """x (float32, already in float16's range) as three float16 parts, returned as float32
    values [3, n] (round to nearest even, as ``__float2half_rn``)."""
    x = np.asarray(x, np.float32)
    hi = x.astype(np.float16).astype(np.float32)
    r1 = (x - hi).astype(np.float32)
    mid = r1.astype(np.float16).astype(np.float32)
    lo = (r1 - mid).astype(np.float32).astype(np.float16).astype(np.float32)
    return np.stack([hi, mid, lo])


def fragment_model(
    codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, x: np.ndarray, subnormal: bool = False
) -> np.ndarray:
    """The kernel's arithmetic in numpy, lane by lane, as :data:`SOURCE` maps it: for each
    tile and group, each lane's A slots (its own words' nibbles, in the order the body
    puts them) against B slots built the way the prologue builds them, summed per column
    as an MMA sums (here in float64); then scale, bias and the lanes' reduction. ``codes``:
    [R, K] integers 0-15; ``scales``, ``biases``: [R, K / 64]; ``x``: [K]; ``subnormal``:
    the SUB scheme's float16 parts of x 2^e (its powers of two taken out again, exactly:
    the model computes in float64). Returns y [R].
    What this proves is the mapping (every (row, k) product exactly once, with x at the
    same k): tests compare it with ``(scales * codes + biases) @ x``."""
    rows, cols = codes.shape
    if subnormal:  # codes times 2^-24, x times 2^e in float16 parts; each group's sum times 2^(24 - e)
        e = x_scale_exponent(x)
        parts = split_f16(np.float32(x) * np.float32(2.0**e)).astype(np.float64) * 2.0**-e
    else:
        parts = split_bf16(x).astype(np.float64)
    xsum = x.astype(np.float64).reshape(-1, GROUP).sum(axis=1)
    y = np.zeros(rows)
    for tile in range(rows // TILE_ROWS):
        for grp in range(cols // GROUP):
            c = np.zeros((TILE_ROWS, 8))  # the tile's C over the group's four MMAs
            for i in range(4):
                a = np.zeros((TILE_ROWS, 16))
                bmat = np.zeros((16, 8))
                for t in range(4):
                    j, p = i // 2, 2 * (i % 2)
                    base = GROUP * grp + 16 * t + 8 * j  # the k of nibble 0 of the lane's word j
                    slots = {2 * t: base + p, 2 * t + 1: base + p + 4, 2 * t + 8: base + p + 1, 2 * t + 9: base + p + 5}
                    for g in range(8):
                        for slot, k in slots.items():
                            a[g, slot] = codes[TILE_ROWS * tile + g, k]
                            a[g + 8, slot] = codes[TILE_ROWS * tile + g + 8, k]
                            if g < 3:  # column g of B: part g of x (the prologue's k0, k0 + 4, ...)
                                bmat[slot, g] = parts[g, k]
                c += a @ bmat
            r = slice(TILE_ROWS * tile, TILE_ROWS * (tile + 1))
            y[r] += scales[r, grp] * (c[:, 0] + c[:, 1] + c[:, 2]) + biases[r, grp] * xsum[grp]
    return y


def _quantized(rows: int, cols: int, seed: int) -> tuple[Any, Any]:
    """A random affine 4-bit matrix (group 64, bfloat16 scales and biases, from bf16
    weights of variance 1/cols) as the workbench's WeightMatrix, and x uniform in [-1, 1)."""
    import mlx.core as mx

    from workbench.fold import WeightMatrix

    rng = np.random.default_rng(seed)
    a = np.sqrt(3.0 / cols)
    dense = mx.array(rng.uniform(-a, a, (rows, cols)).astype(np.float32)).astype(mx.bfloat16)
    x = mx.array(rng.uniform(-1, 1, cols).astype(np.float32))
    return WeightMatrix.quantize(dense, mode="affine", bits=4, group_size=GROUP), x


def matrix_case(rows: int, cols: int, seed: int) -> tuple[Any, Any, np.ndarray, np.ndarray]:
    """One random affine 4-bit matrix as MLX stores it (``QuantizedBase``: codes, scales,
    biases), x, the exact map ``W x`` in float64 and sum |w||x| a row (the check's scale)."""
    wm, x = _quantized(rows, cols, seed)
    q = wm.launch_parts()[0]  # the stored QuantizedBase: codes, scales, biases as MLX made them
    dense = wm.dense(np.float64)  # the stored map, exactly: scale q + bias per weight
    x64 = np.asarray(x, np.float64)
    return q, x, dense @ x64, np.abs(dense) @ np.abs(x64)


def reference_row_dots(q: Any, x: Any, rows: int) -> dict[str, Any]:
    """The kernels' own row dot (:data:`CUDA_CORES`) and MLX's (:data:`MLX_QMM`) on ``q``, ``x``."""
    import mlx.core as mx

    from workbench.decode import matvec_launch
    from workbench.kernels import KernelTuning

    launch = matvec_launch("cuda", q, KernelTuning(), "w")
    zero = mx.zeros((rows,), mx.float32)

    def cuda_core() -> Any:
        return launch(x, zero)[0]

    def mlx_qmm() -> Any:
        return mx.quantized_matmul(x[None, :], q.w, q.scales, q.biases, transpose=True, group_size=GROUP, bits=4)[0]

    return {CUDA_CORES: cuda_core, MLX_QMM: mlx_qmm}


def tensor_core_row_dots(
    q: Any, x: Any, rows: int, cols: int, *, units: int, threads: int, blocks: int
) -> dict[str, Any]:
    """The two tensor-core row dots (:data:`TENSOR_BF16`, :data:`TENSOR_F16_SUBNORMAL`) on ``q``, ``x``."""
    import mlx.core as mx

    kernel = mx.fast.cuda_kernel(
        name="fat_tensor_core_rowdot",
        input_names=["w", "s", "b", "x"],
        output_names=["y"],
        source=SOURCE,
        header=HEADER,
        ensure_row_contiguous=True,
    )

    def tensor_core(subnormal: bool) -> Any:
        def matvec() -> Any:
            return kernel(
                inputs=[q.w, q.scales, q.biases, x],
                template=[("K", cols), ("R", rows), ("NT", threads), ("UG", units), ("SUB", subnormal)],
                grid=(blocks * threads, 1, 1),
                threadgroup=(threads, 1, 1),
                output_shapes=[(rows,)],
                output_dtypes=[mx.float32],
            )[0]

        return matvec

    return {TENSOR_BF16: tensor_core(False), TENSOR_F16_SUBNORMAL: tensor_core(True)}


def run(
    rows: int,
    cols: int,
    *,
    units: int = 4,
    threads: int = 256,
    blocks_per_sm: int = 2,
    repeats: int = 30,
    chain: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """Check and time the four row dots on one random matrix (see the module's doc).
    ``all_checks_passed`` covers the tensor-core variants and the kernels' row dot; MLX's
    own is checked and reported the same way, as a reference, not required to pass."""
    from workbench.kernels import multiprocessor_count

    check_shape(rows, cols, units)
    q, x, truth, scale = matrix_case(rows, cols, seed)
    blocks = min(multiprocessor_count() * blocks_per_sm, rows // TILE_ROWS)
    variants = {
        **tensor_core_row_dots(q, x, rows, cols, units=units, threads=threads, blocks=blocks),
        **reference_row_dots(q, x, rows),
    }
    nbytes = q.w.nbytes + q.scales.nbytes + q.biases.nbytes
    return {
        "shape": [rows, cols],
        "units": units,
        "threads": threads,
        "blocks": blocks,
        "chain": chain,
        "repeats": repeats,
        "seed": seed,
        "weight_bytes": nbytes,
        **measure(variants, truth, scale, nbytes, repeats=repeats, chain=chain),
    }


def measure(
    variants: dict[str, Any],
    truth: np.ndarray,
    scale: np.ndarray,
    nbytes: int,
    *,
    repeats: int,
    chain: int,
    base: str = CUDA_CORES,
    references: tuple[str, ...] = (MLX_QMM,),
) -> dict[str, Any]:
    """Check, then time, row dots of one matrix: each of ``variants`` (name: a function
    returning y) against ``truth`` (the exact map in float64) at :data:`CHECK_TOL` of
    ``scale`` (sum |w||x| a row); then device time a matvec (``chain`` of them in one
    evaluation, ``bench.common.kernels.batched_ms``, which warms each up first), the variants
    alternating round after round (``timing.interleaved``), median of ``repeats``,
    beside the floor (``nbytes`` over ``kernels.floor_bandwidth``) and as a ratio to
    ``base``'s time. ``all_checks_passed`` leaves out ``references`` (reported the same
    way, not required to pass). The record's copy bandwidth, floor, tolerance and rows."""
    from bench.common.kernels import batched_ms, floor_bandwidth
    from bench.common.timing import interleaved

    checks = {}
    for name, fn in variants.items():
        got = np.asarray(fn(), np.float64)
        err = np.abs(got - truth) / np.maximum(scale, 1e-30)
        checks[name] = {"worst_scaled_error": float(err.max()), "passed": bool(err.max() <= CHECK_TOL)}
    bws = floor_bandwidth()  # the floor every CUDA bench divides by
    times = interleaved(
        {name: (lambda fn=fn: batched_ms(fn, n=chain, repeats=1)) for name, fn in variants.items()}, repeats
    )
    floor_ms = nbytes / bws["used_for_floor"] * 1e3
    rows_out = {
        name: {"device_ms": statistics.median(ts), "floor_x": statistics.median(ts) / floor_ms, **checks[name]}
        for name, ts in times.items()
    }
    for r in rows_out.values():
        r["vs_cuda_cores"] = r["device_ms"] / rows_out[base]["device_ms"]
    return {
        "copy_bandwidth_Bps": bws,
        "floor_ms": floor_ms,
        "check_tol": CHECK_TOL,
        "variants": rows_out,
        "all_checks_passed": all(c["passed"] for name, c in checks.items() if name not in references),
    }


#: The check: every output within this of the exact map, relative to sum |w| |x| of its
#: row (the scale float32 rounding errors of a dot product grow with): 2^-16, far above a
#: float32 dot of 5120 terms summed in blocks (~1e-7 measured for the kernels, notebook 03)
#: and far below what a wrong mapping gives (a code at the wrong k: order 1e-2).
CHECK_TOL = 2.0**-16


def print_table(res: dict[str, Any]) -> None:
    rows, cols = res["shape"]
    print(
        f"{rows} x {cols} affine 4-bit (group {GROUP}), {res['weight_bytes'] / 1e6:.1f} MB; copy bandwidth "
        f"{res['copy_bandwidth_Bps']['used_for_floor'] / 1e12:.2f} TB/s, floor {res['floor_ms']:.4f} ms"
    )
    print(f"{'row dot':<35}{'device ms':>10}{'x floor':>9}{'/ CUDA cores':>14}{'worst err':>11}  check")
    for name, r in res["variants"].items():
        print(
            f"{name:<35}{r['device_ms']:>10.4f}{r['floor_x']:>9.2f}{r['vs_cuda_cores']:>14.3f}"
            f"{r['worst_scaled_error']:>11.2e}  {'ok' if r['passed'] else 'FAILED'}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = parser("tensor_core_rowdot", __doc__)
    ap.add_argument("--rows", type=int, default=2 * 17408, help="rows of W (a multiple of 16)")
    ap.add_argument("--cols", type=int, default=5120, help="columns of W (a multiple of 64, at most 7680)")
    ap.add_argument("--units", type=int, default=4, help="groups whose words a lane loads before using any")
    ap.add_argument("--threads", type=int, default=256, help="threads a block (a multiple of 32)")
    ap.add_argument("--blocks-per-sm", type=int, default=2, help="blocks a multiprocessor (the grid)")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds")
    ap.add_argument("--chain", type=int, default=10, help="matvecs in one timed evaluation")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random matrix and x")
    a = ap.parse_args(argv)
    try:
        check_shape(a.rows, a.cols, a.units)
    except ValueError as e:
        ap.error(str(e))
    if a.threads < 32 or a.threads % 32 or a.threads > 1024:
        ap.error(f"--threads must be a multiple of 32 from 32 to 1024; got {a.threads}")
    check_counts(ap, a)
    return run_and_record(
        "tensor_core_rowdot",
        "a tensor-core row dot for affine 4-bit weights beside the kernels' and MLX's",
        argv,
        a,
        "mma.sync",
        lambda: run(
            a.rows,
            a.cols,
            units=a.units,
            threads=a.threads,
            blocks_per_sm=a.blocks_per_sm,
            repeats=a.repeats,
            chain=a.chain,
            seed=a.seed,
        ),
    )


def parser(name: str, doc: str | None) -> argparse.ArgumentParser:
    """A bench command's parser (``cli.parser``: the same record options, the record to
    ``data/bench/``) for the experiment ``name``, run as ``python -m experiments.<name>``."""
    ap = cli.parser(name, doc)
    ap.prog = f"python -m experiments.{name}"
    return ap


def check_counts(ap: Any, a: Any) -> None:
    """``ap``'s usage error unless ``--blocks-per-sm``, ``--repeats`` and ``--chain`` are >= 1."""
    for flag, v in (("--blocks-per-sm", a.blocks_per_sm), ("--repeats", a.repeats), ("--chain", a.chain)):
        if v < 1:
            ap.error(f"{flag} must be >= 1; got {v}")


def run_and_record(
    bench: str, what: str, argv: list[str] | None, a: Any, needs: str, compute: Callable[[], dict[str, Any]]
) -> int:
    """A row-dot bench's end: exit 2 (saying so) without MLX's CUDA back-end (the kernel
    uses ``needs``), else ``compute()``'s result printed as :func:`print_table` prints it
    and written as ``bench``'s record (unless ``--no-record``); 0 if every required check
    passed, else 1."""
    import mlx.core as mx

    if not mx.cuda.is_available():
        print(f"MLX's CUDA backend is not available here: this bench runs {needs} on an NVIDIA GPU")
        return 2
    prov = record.provenance(bench, argv)
    # record.provenance writes the command as a bench command's; this one runs from experiments/
    prov["command"] = prov["command"].replace("python -m bench.", "python -m experiments.", 1)
    res = compute()
    print_table(res)
    rec = {"what": what, **prov, **res}
    if not a.no_record:
        device = prov["device"].get("device_name", "gpu")
        path = record.write(rec, a.out_dir, record.record_stem(bench, device), force=a.force)
        print(f"record: {path}")
    return 0 if res["all_checks_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
