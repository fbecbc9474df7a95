"""An affine 4-bit row dot fed by asynchronous copies, beside the kernels' own (CUDA).

    python -m experiments.async_copy_rowdot                    # gate and up of Bonsai-27B, stacked
    python -m experiments.async_copy_rowdot --stages 4,8,12 --blocks-per-sm 4

Why this exists: every quantized launch of the kernels waits on its loads most while
streaming at under half the copy bandwidth, more loads in flight a lane bought little, and
tensor cores, with far fewer instructions, cut the row dot's time by a tenth: the bound is
the bytes each multiprocessor keeps in flight (docs/JOURNAL.md, "What was left open",
names the records). In the kernels a byte in flight is a register until it is used, so registers cap it. Here the
weights go from device memory to group memory by ``cp.async`` (16 bytes a lane, no
register), issued ``--stages`` - 1 steps ahead of the step that reads them: bytes in
flight are group memory, of which an SM has far more.

What :data:`SOURCE` does, a warp at a time (:func:`step_model` is the same index
arithmetic in numpy, tested on the CPU):

- **Prologue.** The block copies x into group memory, 36 floats a 32-weight unit (32 and
  four of padding, so that eight lanes reading eight consecutive units' x hit eight
  different bank groups), and each unit's sum of x (for the biases).
- **Steps.** A warp owns rows ``warp, warp + W, ...`` (W the grid's warps); a row is
  ``K / 1024`` steps of 32 units, one a lane (16 bytes: 32 codes of one half group). Step
  j's copy goes into ring slot ``j % stages`` of the warp's own ring: every lane its unit,
  lanes 0-1 the step's 16 scales and lanes 2-3 its 16 biases (32 bytes each). Before
  reading step j, a lane waits until at most ``stages - 1`` of its copy groups are pending
  (``cp.async.wait_group``), and the warp syncs, so the scale lanes' copies are visible;
  the warp syncs again after reading, so the next copy may reuse the slot.
- **Row dot.** A code becomes a float exactly (``0x4B000000 | q`` is 2^23 + q; one subtract),
  one FMA a weight into a lane's unit sum; each unit adds scale x its sum + bias x its sum
  of x, and a row's 32 lanes are summed by shuffles at its last step.

It runs beside the kernels' own row dot (``tensor_core_rowdot.CUDA_CORES``), the bf16
tensor-core row dot and ``mx.quantized_matmul`` (a reference) on the same matrix, each
checked against the exact map in float64 at ``tensor_core_rowdot.CHECK_TOL`` before any
is timed (``tensor_core_rowdot.measure``: device time, floor, ratios to the kernels' row
dot). A record (device, date, MLX version, command) goes to ``data/bench/``. Needs MLX's
CUDA backend (exit 2 without it).
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from experiments import tensor_core_rowdot as tc

#: Weights a lane's 16-byte unit holds (4-bit codes), and units a warp step takes (one a lane).
UNIT = 32
STEP_UNITS = 32

#: Weights a step takes: the row length must be a whole number of steps.
STEP = UNIT * STEP_UNITS

#: Floats of group memory a unit's x takes: 32 and 4 of padding (the bank-conflict rule above).
X_PITCH = 36

#: 16-byte slots a ring stage takes: 32 units, 2 of scales, 2 of biases.
STAGE_SLOTS = STEP_UNITS + 4

#: CUDA's limit on a kernel's static group (shared) memory.
STATIC_SHARED_LIMIT = 48 * 1024

#: The body, ``async_copy_rowdot.cu`` beside this file (MLX's ``mx.fast.cuda_kernel`` wraps it
#: in its signature: inputs ``w`` (uint32 codes, [R, K/8]), ``s`` and ``b`` (bfloat16 scales and
#: biases, [R, K/64]), ``x`` (float32, [K]); output ``y`` (float32, [R])). Template values: K,
#: R, NT (threads a block), ST (ring stages).
SOURCE = (tc.HERE / "async_copy_rowdot.cu").read_text()

#: Helpers the body calls, put in the kernel's header: ``async_copy_rowdot.cuh``.
HEADER = (tc.HERE / "async_copy_rowdot.cuh").read_text()


def shared_bytes(cols: int, threads: int, stages: int) -> int:
    """The kernel's static group memory: x padded, the units' sums of x, every warp's ring."""
    units = cols // UNIT
    return units * X_PITCH * 4 + units * 4 + (threads // 32) * stages * STAGE_SLOTS * 16


def check_shape(rows: int, cols: int, threads: int, stages: int) -> None:
    """Raises ValueError naming the parameter unless the kernel can take it: rows >= 1,
    cols a whole number of steps (:data:`STEP` weights), threads whole warps up to 1024,
    stages >= 2 (one being read while the next lands), and the static group memory within
    :data:`STATIC_SHARED_LIMIT`."""
    if not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be a positive integer; got {rows!r}")
    if not isinstance(cols, int) or cols < STEP or cols % STEP:
        raise ValueError(f"cols must be a positive multiple of {STEP} (a warp step of 32 units); got {cols!r}")
    if not isinstance(threads, int) or threads < 32 or threads % 32 or threads > 1024:
        raise ValueError(f"threads must be a multiple of 32 from 32 to 1024; got {threads!r}")
    if not isinstance(stages, int) or stages < 2:
        raise ValueError(f"stages must be an integer >= 2; got {stages!r}")
    need = shared_bytes(cols, threads, stages)
    if need > STATIC_SHARED_LIMIT:
        raise ValueError(
            f"stages: {stages} stages of {threads // 32} warps at cols {cols} need {need} bytes of "
            f"group memory, over CUDA's static limit of {STATIC_SHARED_LIMIT}"
        )


def step_model(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, x: np.ndarray, warps: int) -> np.ndarray:
    """The kernel's index arithmetic in numpy, for a grid of ``warps`` warps: each warp's
    rows and steps, each lane's unit, its scale and bias as the step's copied slots hold
    them, its x read from the padded layout, summed as the body sums (here in float64).
    ``codes``: [R, K] integers 0-15; ``scales``, ``biases``: [R, K / 64]; ``x``: [K].
    What it proves is the mapping (each code meets its own x, scale and bias once): tests
    compare it with ``(scales * codes + biases) @ x``."""
    rows, cols = codes.shape
    units, spr, groups = cols // UNIT, cols // STEP, cols // 64
    xs = np.zeros(units * X_PITCH)
    k = np.arange(cols)
    xs[(k >> 5) * X_PITCH + (k & 31)] = x
    xu = x.astype(np.float64).reshape(units, UNIT).sum(axis=1)
    words = codes.reshape(rows, units, 4, 8)  # a unit's 4 words of 8 codes (code n of word i: weight 8 i + n)
    y = np.zeros(rows)
    for gw in range(warps):
        rows_of = range(gw, rows, warps)
        for j in range(len(rows_of) * spr):
            row, st = rows_of[j // spr], j % spr
            # what the step's copies put in its slot: the units, then 16 scales and 16 biases
            slot_scales = scales.reshape(rows * groups)[row * groups + st * 16 : row * groups + st * 16 + 16]
            slot_biases = biases.reshape(rows * groups)[row * groups + st * 16 : row * groups + st * 16 + 16]
            for lane in range(STEP_UNITS):
                unit = st * STEP_UNITS + lane
                xv = xs[unit * X_PITCH : unit * X_PITCH + 32]
                d = sum(words[row, unit, i, n] * xv[8 * i + n] for i in range(4) for n in range(8))
                y[row] += slot_scales[lane >> 1] * d + slot_biases[lane >> 1] * xu[unit]
    return y


def async_row_dots(
    q: Any, x: Any, rows: int, cols: int, *, threads: int, blocks: int, stages: list[int]
) -> dict[str, Any]:
    """The row dot fed by asynchronous copies on ``q``, ``x``, one variant a ring depth."""
    import mlx.core as mx

    kernel = mx.fast.cuda_kernel(
        name="fat_async_copy_rowdot",
        input_names=["w", "s", "b", "x"],
        output_names=["y"],
        source=SOURCE,
        header=HEADER,
        ensure_row_contiguous=True,
    )

    def matvec(st: int) -> Any:
        def run() -> Any:
            return kernel(
                inputs=[q.w, q.scales, q.biases, x],
                template=[("K", cols), ("R", rows), ("NT", threads), ("ST", st)],
                grid=(blocks * threads, 1, 1),
                threadgroup=(threads, 1, 1),
                output_shapes=[(rows,)],
                output_dtypes=[mx.float32],
            )[0]

        return run

    return {variant_name(st): matvec(st) for st in stages}


def variant_name(stages: int) -> str:
    """A ring depth's name in the table and the record."""
    return f"CUDA cores, cp.async {stages} stages"


def run(
    rows: int,
    cols: int,
    *,
    threads: int = 128,
    blocks_per_sm: int = 4,
    stages: list[int] | None = None,
    repeats: int = 30,
    chain: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """Check and time the row dots on one random matrix (see the module's doc).
    ``all_checks_passed`` covers every variant but MLX's (a reference)."""
    from workbench.kernels import multiprocessor_count

    stages = stages or [4, 8]
    for st in stages:
        check_shape(rows, cols, threads, st)
    q, x, truth, scale = tc.matrix_case(rows, cols, seed)
    sms = multiprocessor_count()
    warps_per_block = threads // 32
    blocks = min(sms * blocks_per_sm, -(-rows // warps_per_block))
    tensor = tc.tensor_core_row_dots(q, x, rows, cols, units=4, threads=256, blocks=min(sms * 2, rows // tc.TILE_ROWS))
    variants = {
        **async_row_dots(q, x, rows, cols, threads=threads, blocks=blocks, stages=stages),
        tc.TENSOR_BF16: tensor[tc.TENSOR_BF16],
        **tc.reference_row_dots(q, x, rows),
    }
    nbytes = q.w.nbytes + q.scales.nbytes + q.biases.nbytes
    return {
        "shape": [rows, cols],
        "threads": threads,
        "blocks": blocks,
        "stages": stages,
        "chain": chain,
        "repeats": repeats,
        "seed": seed,
        "weight_bytes": nbytes,
        "shared_bytes": {str(st): shared_bytes(cols, threads, st) for st in stages},
        **tc.measure(variants, truth, scale, nbytes, repeats=repeats, chain=chain),
    }


def main(argv: list[str] | None = None) -> int:
    ap = tc.parser("async_copy_rowdot", __doc__)
    ap.add_argument("--rows", type=int, default=2 * 17408, help="rows of W")
    ap.add_argument("--cols", type=int, default=5120, help=f"columns of W (a multiple of {STEP})")
    ap.add_argument("--threads", type=int, default=128, help="threads a block (a multiple of 32)")
    ap.add_argument("--blocks-per-sm", type=int, default=4, help="blocks a multiprocessor (the grid)")
    ap.add_argument("--stages", default="4,8", help="comma list of ring depths, each >= 2 (one variant each)")
    ap.add_argument("--repeats", type=int, default=30, help="timed rounds")
    ap.add_argument("--chain", type=int, default=10, help="matvecs in one timed evaluation")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random matrix and x")
    a = ap.parse_args(argv)
    try:
        stages = [int(v) for v in a.stages.split(",")]
    except ValueError:
        ap.error(f"--stages must be a comma list of integers; got {a.stages!r}")
    try:
        for st in stages:
            check_shape(a.rows, a.cols, a.threads, st)
    except ValueError as e:
        ap.error(str(e))
    tc.check_counts(ap, a)
    return tc.run_and_record(
        "async_copy_rowdot",
        "an affine 4-bit row dot fed by asynchronous copies beside the kernels' and MLX's",
        argv,
        a,
        "cp.async",
        lambda: run(
            a.rows,
            a.cols,
            threads=a.threads,
            blocks_per_sm=a.blocks_per_sm,
            stages=stages,
            repeats=a.repeats,
            chain=a.chain,
            seed=a.seed,
        ),
    )


if __name__ == "__main__":
    sys.exit(main())
