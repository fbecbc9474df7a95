"""A tensor-core row dot for affine 4-bit weights, beside the kernels' CUDA-core one (CUDA).

    python -m bench.tensor_core_rowdot                    # gate and up of Bonsai-27B, stacked
    python -m bench.tensor_core_rowdot --rows 4096 --cols 1024 --repeats 20

Why this exists: the kernels' 4-bit launches stay at 3-4x their floors (kernels/README.md,
"Left"). In the CUDA-core scheme every weight costs a code placement, an exact subtract
and an FMA, and every lane reads its own x from group memory, once a row. This bench
measures the alternative before any body is rewritten: ``mma.sync`` (m16n8k16, bfloat16
in, float32 accumulators) on one matrix ``y = W x``, W in MLX's affine 4-bit layout
(group 64, bfloat16 scales and biases), against

- the kernels' own row dot on the same matrix (``decode_matvec._matvec_launch``: the
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
  a group (lanes of the zero columns read one zeroed pair, group after group), and one read of x serves 16 rows instead of one.
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

import statistics
import sys
from typing import Any, Callable

import numpy as np

from bench.common import record

#: Rows an MMA tile takes (the instruction's M) and weights a quantization group.
TILE_ROWS = 16
GROUP = 64

#: The kernel body (MLX's ``mx.fast.cuda_kernel`` wraps it in its signature: inputs ``w``
#: (uint32 codes, [R, K/8]), ``s`` and ``b`` (bfloat16 scales and biases, [R, K/64]), ``x``
#: (float32, [K]); output ``y`` (float32, [R])). Template values: K, R, NT (threads a
#: block), UG (groups whose words a lane loads before using any), SUB (the codes as
#: subnormal float16s, x as float16 parts; else bfloat16).
SOURCE = r"""
  constexpr int NG = K / 64;                       // quantization groups a row
  __shared__ uint4 xb[NG * 3 * 4 * 2];             // [group][part][t]: a lane's B registers
  __shared__ float xsum[NG];                       // each group's sum of x (for the biases)
  __shared__ uint4 xzero[2];                       // the B registers of lanes g >= 3: zeros
  const int lid = threadIdx.x, lane = lid & 31, warp = lid >> 5;
  const int g = lane >> 2, t = lane & 3;

  // 0. SUB: x is scaled by 2^e into float16's range first, e from max |x| (every block
  // finds the same); the codes' 2^-24 and this 2^e come off each group's sum (unscale).
  __shared__ float xmax[32];
  float xscale = 1.0f, unscale = 1.0f;
  if (SUB) {
    float m = 0.0f;
    for (int k = lid; k < K; k += NT) m = fmaxf(m, fabsf(x[k]));
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) xmax[warp] = m;
    __syncthreads();
    m = 0.0f;
    for (int j = 0; j < NT / 32; ++j) m = fmaxf(m, xmax[j]);
    int ex = 0;
    frexpf(m, &ex);                                // m < 2^ex (m = 0: ex = 0)
    const int e = max(-100, min(100, 15 - ex));    // max |x| 2^e < 2^15 <= 65504; both finite
    xscale = ldexpf(1.0f, e);
    unscale = ldexpf(1.0f, 24 - e);
  }

  // 1. x's three parts (bfloat16, or with SUB float16 of x 2^e), as each lane's B
  // fragment wants them. Register v (0-7) of lane t's part for a group: MMA i = v / 2, its
  // pair b0b1 (v even) or b2b3 (v odd), which hold x at k0 and k0 + 4,
  // k0 = 64 group + 16 t + 8 (i / 2) + 2 (i % 2) + v % 2.
  unsigned* xbw = reinterpret_cast<unsigned*>(xb);
  for (int e = lid; e < NG * 3 * 4 * 8; e += NT) {
    const int v = e & 7, tt = (e >> 3) & 3, pg = e >> 5;
    const int part = pg % 3, grp = pg / 3, i = v >> 1;
    const int k0 = 64 * grp + 16 * tt + 8 * (i >> 1) + 2 * (i & 1) + (v & 1);
    xbw[e] = split_part<SUB>(x[k0] * xscale, part) | (split_part<SUB>(x[k0 + 4] * xscale, part) << 16);
  }
  if (lid < 2) xzero[lid] = make_uint4(0u, 0u, 0u, 0u);
  for (int grp = lid; grp < NG; grp += NT) {
    float sum = 0.0f;
    for (int k = 0; k < 64; ++k) sum += x[64 * grp + k];
    xsum[grp] = sum;
  }
  __syncthreads();

  // 2. Tiles of 16 rows, one a warp at a time.
  const unsigned short* S = reinterpret_cast<const unsigned short*>(s);
  const unsigned short* B = reinterpret_cast<const unsigned short*>(b);
  // lanes g < 3 read their part's B registers, group after group; lanes g >= 3 (B's
  // zero columns) read the same zeros every group: no select in the loop
  const uint4* bbase = g < 3 ? xb + (g * 4 + t) * 2 : xzero;
  const int bstride = g < 3 ? 3 * 4 * 2 : 0;
  const int warps = (NT / 32) * gridDim.x;
  for (int tile = blockIdx.x * (NT / 32) + warp; tile < R / 16; tile += warps) {
    const int r0 = 16 * tile + g, r1 = r0 + 8;
    const uint2* w0 = reinterpret_cast<const uint2*>(w + (size_t)r0 * (K / 8)) + t;
    const uint2* w1 = reinterpret_cast<const uint2*>(w + (size_t)r1 * (K / 8)) + t;
    float acc0 = 0.0f, acc1 = 0.0f;
    for (int grp0 = 0; grp0 < NG; grp0 += UG) {
      uint2 q0[UG], q1[UG];
      unsigned short s0[UG], s1[UG], b0[UG], b1[UG];
      #pragma unroll
      for (int u = 0; u < UG; ++u) {                 // every load of the batch first
        q0[u] = __ldcs(w0 + 4 * (grp0 + u));
        q1[u] = __ldcs(w1 + 4 * (grp0 + u));
        s0[u] = S[r0 * NG + grp0 + u];
        s1[u] = S[r1 * NG + grp0 + u];
        b0[u] = B[r0 * NG + grp0 + u];
        b1[u] = B[r1 * NG + grp0 + u];
      }
      #pragma unroll
      for (int u = 0; u < UG; ++u) {
        const int grp = grp0 + u;
        const uint4* bx = bbase + grp * bstride;
        const uint4 bA = bx[0], bB = bx[1];
        float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        group_mmas<SUB>(c, q0[u], q1[u], bA, bB);
        acc0 = fmaf(bf16_float(s0[u]), SUB ? (c[0] + c[1]) * unscale : c[0] + c[1], acc0);
        acc1 = fmaf(bf16_float(s1[u]), SUB ? (c[2] + c[3]) * unscale : c[2] + c[3], acc1);
        if (t == 0) {
          acc0 = fmaf(bf16_float(b0[u]), xsum[grp], acc0);
          acc1 = fmaf(bf16_float(b1[u]), xsum[grp], acc1);
        }
      }
    }
    // lane t = 0 holds hi + mid (and the biases), t = 1 lo; t = 2, 3 zeros
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    if (t == 0) {
      y[r0] = acc0;
      y[r1] = acc1;
    }
  }
"""

#: Helpers the body calls, put in the kernel's header.
HEADER = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// part 0, 1 or 2 of v split into three bfloat16s (F16: float16s, v already scaled into
// their range), as its 16 bits: each part the rounding of what the parts before it left
// (each subtraction exact), so the three sum to v to 24 significant bits or more
template <bool F16>
__device__ __forceinline__ unsigned split_part(float v, int part) {
  unsigned bits = 0u;
  #pragma unroll
  for (int i = 0; i < 3; ++i) {
    if (i > part) break;
    if (F16) {
      const __half h = __float2half_rn(v);
      bits = __half_as_ushort(h);
      v -= __half2float(h);
    } else {
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      bits = __bfloat16_as_ushort(h);
      v -= __bfloat162float(h);
    }
  }
  return bits;
}

__device__ __forceinline__ float bf16_float(unsigned short v) {
  return __uint_as_float(((unsigned)v) << 16);
}

// nibbles n and n + 4 of v as the bfloat16 pair (q_n, q_{n+4}): one mask-and-or makes
// (128 + q_n, 128 + q_{n+4}) (0x4300 is 128; its last mantissa bit is worth 1), one packed
// subtract leaves the codes, exactly
__device__ __forceinline__ unsigned code_pair(unsigned v, int n) {
  // (v >> 4n) & mask | 128s in ONE LOP3: written as C, ptxas spends two (a LOP3 takes one
  // immediate), so the 128s go in as a register (as kernels/prelude_cuda.h's and_or)
  unsigned biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(biased) : "r"(v >> (4 * n)), "n"(0x000F000F), "r"(0x43004300u));
  const __nv_bfloat162 d = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   __floats2bfloat162_rn(128.0f, 128.0f));
  return *reinterpret_cast<const unsigned*>(&d);
}

// nibbles n and n + 4 of v, masked in place: the float16 pair (q_n 2^-24, q_{n+4} 2^-24),
// subnormal and exact
__device__ __forceinline__ unsigned code_pair_subnormal(unsigned v, int n) {
  return (v >> (4 * n)) & 0x000F000Fu;
}

// c += A B: one m16n8k16 MMA, bfloat16 (F16: float16) A (4 registers) and B (2), float32 C
template <bool F16>
__device__ __forceinline__ void mma16816(float* c, unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
  if (F16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

// The four MMAs of one group: MMA i takes word i / 2 of rows g (q0) and g + 8 (q1),
// nibbles (p, p + 4) in A's registers 0-1 and (p + 1, p + 5) in 2-3, p = 2 (i % 2); B's
// registers for MMA i are bA's (i < 2) or bB's pair 2 (i % 2), 2 (i % 2) + 1.
template <bool SUB>
__device__ __forceinline__ void group_mmas(float* c, uint2 q0, uint2 q1, uint4 bA, uint4 bB) {
#define PAIR(v, n) (SUB ? code_pair_subnormal((v), (n)) : code_pair((v), (n)))
  mma16816<SUB>(c, PAIR(q0.x, 0), PAIR(q1.x, 0), PAIR(q0.x, 1), PAIR(q1.x, 1), bA.x, bA.y);
  mma16816<SUB>(c, PAIR(q0.x, 2), PAIR(q1.x, 2), PAIR(q0.x, 3), PAIR(q1.x, 3), bA.z, bA.w);
  mma16816<SUB>(c, PAIR(q0.y, 0), PAIR(q1.y, 0), PAIR(q0.y, 1), PAIR(q1.y, 1), bB.x, bB.y);
  mma16816<SUB>(c, PAIR(q0.y, 2), PAIR(q1.y, 2), PAIR(q0.y, 3), PAIR(q1.y, 3), bB.z, bB.w);
#undef PAIR
}
"""


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


def fragment_model(codes: np.ndarray, scales: np.ndarray, biases: np.ndarray, x: np.ndarray,
                   subnormal: bool = False) -> np.ndarray:
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
        parts = split_f16(np.float32(x) * np.float32(2.0 ** e)).astype(np.float64) * 2.0 ** -e
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
                    slots = {2 * t: base + p, 2 * t + 1: base + p + 4, 2 * t + 8: base + p + 1,
                             2 * t + 9: base + p + 5}
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

    from workbench.fold.weights import WeightMatrix

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

    from workbench.decode import matvec as decode_matvec
    from workbench.kernels.launch import KernelTuning

    launch = decode_matvec._matvec_launch("cuda", q, KernelTuning(), "w")
    zero = mx.zeros((rows,), mx.float32)

    def cuda_core() -> Any:
        return launch(x, zero)[0]

    def mlx_qmm() -> Any:
        return mx.quantized_matmul(x[None, :], q.w, q.scales, q.biases, transpose=True, group_size=GROUP,
                                   bits=4)[0]

    return {CUDA_CORES: cuda_core, MLX_QMM: mlx_qmm}


def tensor_core_row_dots(q: Any, x: Any, rows: int, cols: int, *, units: int, threads: int,
                         blocks: int) -> dict[str, Any]:
    """The two tensor-core row dots (:data:`TENSOR_BF16`, :data:`TENSOR_F16_SUBNORMAL`) on ``q``, ``x``."""
    import mlx.core as mx

    kernel = mx.fast.cuda_kernel(name="fat_tensor_core_rowdot", input_names=["w", "s", "b", "x"], output_names=["y"],
                                 source=SOURCE, header=HEADER, ensure_row_contiguous=True)

    def tensor_core(subnormal: bool) -> Any:
        def matvec() -> Any:
            return kernel(inputs=[q.w, q.scales, q.biases, x],
                          template=[("K", cols), ("R", rows), ("NT", threads), ("UG", units), ("SUB", subnormal)],
                          grid=(blocks * threads, 1, 1), threadgroup=(threads, 1, 1), output_shapes=[(rows,)],
                          output_dtypes=[mx.float32])[0]
        return matvec

    return {TENSOR_BF16: tensor_core(False), TENSOR_F16_SUBNORMAL: tensor_core(True)}


def run(rows: int, cols: int, *, units: int = 4, threads: int = 256, blocks_per_sm: int = 2,
        repeats: int = 30, chain: int = 10, seed: int = 0) -> dict[str, Any]:
    """Check and time the four row dots on one random matrix (see the module's doc).
    ``all_checks_passed`` covers the tensor-core variants and the kernels' row dot; MLX's
    own is checked and reported the same way, as a reference, not required to pass."""
    from workbench.kernels import cuda_device

    check_shape(rows, cols, units)
    q, x, truth, scale = matrix_case(rows, cols, seed)
    blocks = min(cuda_device.multiprocessor_count() * blocks_per_sm, rows // TILE_ROWS)
    variants = {**tensor_core_row_dots(q, x, rows, cols, units=units, threads=threads, blocks=blocks),
                **reference_row_dots(q, x, rows)}
    nbytes = q.w.nbytes + q.scales.nbytes + q.biases.nbytes
    return {"shape": [rows, cols], "units": units, "threads": threads, "blocks": blocks, "chain": chain,
            "repeats": repeats, "seed": seed, "weight_bytes": nbytes,
            **measure(variants, truth, scale, nbytes, repeats=repeats, chain=chain)}


def measure(variants: dict[str, Any], truth: np.ndarray, scale: np.ndarray, nbytes: int, *, repeats: int,
            chain: int, base: str = CUDA_CORES, references: tuple[str, ...] = (MLX_QMM,)) -> dict[str, Any]:
    """Check, then time, row dots of one matrix: each of ``variants`` (name: a function
    returning y) against ``truth`` (the exact map in float64) at :data:`CHECK_TOL` of
    ``scale`` (sum |w||x| a row); then device time a matvec (``chain`` of them in one
    evaluation, ``kernel_bench.batched_ms``, which warms each up first), the variants
    alternating round after round (``kernel_bodies.interleaved``), median of ``repeats``,
    beside the floor (``nbytes`` over ``kernel_bench.floor_bandwidth``) and as a ratio to
    ``base``'s time. ``all_checks_passed`` leaves out ``references`` (reported the same
    way, not required to pass). The record's copy bandwidth, floor, tolerance and rows."""
    from bench import kernel_bench
    from bench.kernel_bodies import interleaved

    checks = {}
    for name, fn in variants.items():
        got = np.asarray(fn(), np.float64)
        err = np.abs(got - truth) / np.maximum(scale, 1e-30)
        checks[name] = {"worst_scaled_error": float(err.max()), "passed": bool(err.max() <= CHECK_TOL)}
    bws = kernel_bench.floor_bandwidth()  # the floor every CUDA bench divides by
    times = interleaved({name: (lambda fn=fn: kernel_bench.batched_ms(fn, n=chain, repeats=1))
                         for name, fn in variants.items()}, repeats)
    floor_ms = nbytes / bws["used_for_floor"] * 1e3
    rows_out = {name: {"device_ms": statistics.median(ts), "floor_x": statistics.median(ts) / floor_ms,
                       **checks[name]} for name, ts in times.items()}
    for r in rows_out.values():
        r["vs_cuda_cores"] = r["device_ms"] / rows_out[base]["device_ms"]
    return {"copy_bandwidth_Bps": bws, "floor_ms": floor_ms, "check_tol": CHECK_TOL, "variants": rows_out,
            "all_checks_passed": all(c["passed"] for name, c in checks.items() if name not in references)}


#: The check: every output within this of the exact map, relative to sum |w| |x| of its
#: row (the scale float32 rounding errors of a dot product grow with): 2^-16, far above a
#: float32 dot of 5120 terms summed in blocks (~1e-7 measured for the kernels, notebook 03)
#: and far below what a wrong mapping gives (a code at the wrong k: order 1e-2).
CHECK_TOL = 2.0 ** -16


def print_table(res: dict[str, Any]) -> None:
    rows, cols = res["shape"]
    print(f"{rows} x {cols} affine 4-bit (group {GROUP}), {res['weight_bytes'] / 1e6:.1f} MB; copy bandwidth "
          f"{res['copy_bandwidth_Bps']['used_for_floor'] / 1e12:.2f} TB/s, floor {res['floor_ms']:.4f} ms")
    print(f"{'row dot':<35}{'device ms':>10}{'x floor':>9}{'/ CUDA cores':>14}{'worst err':>11}  check")
    for name, r in res["variants"].items():
        print(f"{name:<35}{r['device_ms']:>10.4f}{r['floor_x']:>9.2f}{r['vs_cuda_cores']:>14.3f}"
              f"{r['worst_scaled_error']:>11.2e}  {'ok' if r['passed'] else 'FAILED'}")


def main(argv: list[str] | None = None) -> int:
    ap = record.parser("tensor_core_rowdot", __doc__)
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
    return run_and_record("tensor_core_rowdot", "a tensor-core row dot for affine 4-bit weights beside the kernels' "
                          "and MLX's", argv, a, "mma.sync",
                          lambda: run(a.rows, a.cols, units=a.units, threads=a.threads, blocks_per_sm=a.blocks_per_sm,
                                      repeats=a.repeats, chain=a.chain, seed=a.seed))


def check_counts(ap: Any, a: Any) -> None:
    """``ap``'s usage error unless ``--blocks-per-sm``, ``--repeats`` and ``--chain`` are >= 1."""
    for flag, v in (("--blocks-per-sm", a.blocks_per_sm), ("--repeats", a.repeats), ("--chain", a.chain)):
        if v < 1:
            ap.error(f"{flag} must be >= 1; got {v}")


def run_and_record(bench: str, what: str, argv: list[str] | None, a: Any, needs: str,
                   compute: Callable[[], dict[str, Any]]) -> int:
    """A row-dot bench's end: exit 2 (saying so) without MLX's CUDA back-end (the kernel
    uses ``needs``), else ``compute()``'s result printed as :func:`print_table` prints it
    and written as ``bench``'s record (unless ``--no-record``); 0 if every required check
    passed, else 1."""
    import mlx.core as mx

    if not mx.cuda.is_available():
        print(f"MLX's CUDA backend is not available here: this bench runs {needs} on an NVIDIA GPU")
        return 2
    prov = record.provenance(bench, argv)
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
