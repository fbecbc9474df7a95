"""half and bfloat arithmetic in the emulator rounded at EVERY operation, as Metal computes
them, and the SIMD-group votes (``simd_ballot``, ``simd_all``, ``simd_any``).

Oracles and tolerances, all exact (bits compared):

- half: numpy's float16, op by op (numpy rounds each float16 operation to nearest even,
  subnormals, infinities and NaN included); fma against the exact value of ``a * b + c``
  (``fractions.Fraction``) rounded once to half by :func:`_round_exact`. A chain whose
  once-rounded result differs from the per-operation one is included, and the test first
  checks that it does differ on these inputs (otherwise it could not fail).
- bfloat16: each operation in float64 (exact for products of 8-bit significands and for
  sums of the moderate values used; a quotient's two roundings are innocuous, 53 >= 2 x 8 + 2)
  then rounded to bfloat16 by an explicit float64 -> bfloat16 round-to-nearest-even
  (:func:`_bf16`), step by step.
- votes: the lanes' predicates read back in numpy, bit for bit.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mlx.core as mx
import numpy as np
import pytest

from workbench.kernels import metal_emulation
from workbench.kernels.metal_drop_in import metal_kernel

pytestmark = pytest.mark.skipif(metal_emulation.clang_path() is None, reason="needs clang++")


def _bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    """Equal bits, except that any NaN matches any NaN (a NaN's payload is not specified)."""
    g, w = got.astype(want.dtype), want
    nan = np.isnan(w.astype(np.float32))
    assert np.array_equal(np.isnan(g.astype(np.float32)), nan)
    u = {2: np.uint16, 4: np.uint32}[w.dtype.itemsize]
    bad = np.flatnonzero(g[~nan].view(u) != w[~nan].view(u))
    assert bad.size == 0, f"{bad.size} differ, first at {bad[0]}: got {g[~nan][bad[0]]!r}, want {w[~nan][bad[0]]!r}"


def _run(source, inputs, n, outputs):
    """``source`` launched over ``n`` threads (groups of 64) with ``inputs`` (numpy or mx
    arrays), outputs ``[(count, mx dtype)]``."""
    kernel = metal_kernel(
        name="half_ops",
        input_names=[f"in{k}" for k in range(len(inputs))],
        output_names=[f"o{k}" for k in range(len(outputs))],
        source=source,
    )
    return kernel(
        inputs=[a if isinstance(a, mx.array) else mx.array(a) for a in inputs],
        grid=(n, 1, 1),
        threadgroup=(64, 1, 1),
        output_shapes=[(c,) for c, _ in outputs],
        output_dtypes=[d for _, d in outputs],
    )


def _halves(rng, n):
    """Random halves over the whole range (subnormals and values that overflow when
    multiplied included) and the special values."""
    special = np.array(
        [0.0, -0.0, 65504.0, -65504.0, 6e-8, -6e-8, 6.1e-5, np.inf, -np.inf, 1.0, 2049.0, 0.1], np.float16
    )
    mag = rng.standard_normal(n - special.size) * 2.0 ** rng.integers(-24, 14, n - special.size)
    return np.concatenate([special, mag.astype(np.float16)])


HALF_OPS = """
uint i = thread_position_in_grid.x;
half a = in0[i], b = in1[i];
o0[i * 12 + 0] = a + b;
o0[i * 12 + 1] = a - b;
o0[i * 12 + 2] = a * b;
o0[i * 12 + 3] = a / b;
o0[i * 12 + 4] = (a * b + a) * b - a;   // four roundings
half c = a;
c += b; c *= a; c -= b; c /= b;
o0[i * 12 + 5] = c;
o0[i * 12 + 6] = a + 2049;              // the int converted to half (2048) first
o0[i * 12 + 7] = a * 0.1h + b;
half4 v = half4(a, b, a, b);
half4 w = v * v + half4(b);
o0[i * 12 + 8] = w.x;
o0[i * 12 + 9] = w.w;
o0[i * 12 + 10] = -a;
o0[i * 12 + 11] = (a < b) ? a : b;
o1[i] = a * 3.0f;                        // half op float -> float
"""


def test_half_operations_round_each_result_as_numpy_float16():
    rng = np.random.default_rng(5)
    n = 4096
    a, b = _halves(rng, n), _halves(rng, n)[::-1].copy()
    o0, o1 = _run(HALF_OPS, [a, b], n, [(n * 12, mx.float16), (n, mx.float32)])
    got = np.array(o0).reshape(n, 12)
    with np.errstate(all="ignore"):
        c = a + b
        c = c * a
        c = c - b
        c = c / b
        w = [a * a + b, b * b + b]
        want = [a + b, a - b, a * b, a / b, (a * b + a) * b - a, c, a + np.float16(2049), a * np.float16(0.1) + b]
        want += [*w, -a, np.where(a < b, a, b)]
        once = ((a.astype(np.float32) * b + a) * b - a).astype(np.float16)
    # The chain rounded once differs from the chain rounded at each operation on these
    # inputs, so per-operation rounding is what the comparison checks.
    assert (np.asarray(want[4]).view(np.uint16) != once.view(np.uint16))[~np.isnan(once)].sum() > 100
    for k, wk in enumerate(want):
        _bits_equal(got[:, k], np.asarray(wk, np.float16))
    _bits_equal(np.array(o1), a.astype(np.float32) * np.float32(3.0))


def _round_exact(x: Fraction, fraction_bits: int, emin: int, emax: int) -> float:
    """``x`` rounded to nearest even to a binary format of ``fraction_bits`` and exponents
    ``emin`` (the least normal's) to ``emax``: infinity past the largest finite value."""
    if x == 0:
        return 0.0
    e = max(math.floor(math.log2(abs(x))), emin)
    while Fraction(2) ** e > abs(x) and e > emin:  # log2 of a Fraction can be a hair off
        e -= 1
    while Fraction(2) ** (e + 1) <= abs(x):
        e += 1
    ulp = Fraction(2) ** (e - fraction_bits)
    r = round(x / ulp) * ulp  # Python's round of a Fraction: to nearest, ties to even
    return math.copysign(math.inf, x) if abs(r) >= Fraction(2) ** (emax + 1) else float(r)


HALF_MATH = """
uint i = thread_position_in_grid.x;
half a = in0[i], b = in1[i];
o0[i * 4 + 0] = sqrt(a) * b;            // sqrt(half) is a half: two roundings
o0[i * 4 + 1] = max(a, b) + min(a, b);
o0[i * 4 + 2] = abs(a) - b;
o0[i * 4 + 3] = clamp(a, -b, b);
"""


def test_half_math_functions_return_half():
    """sqrt, max, min, abs, clamp of halves are halves (Metal's overloads), so the operation
    after them rounds to half too; sqrt is correctly rounded in both numpy and here."""
    rng = np.random.default_rng(9)
    n = 512
    a = np.abs(_halves(rng, n))
    b = np.abs(_halves(rng, n))[::-1].copy()
    (o,) = _run(HALF_MATH, [a, b], n, [(n * 4, mx.float16)])
    got = np.array(o).reshape(n, 4)
    with np.errstate(all="ignore"):
        want = [np.sqrt(a) * b, np.maximum(a, b) + np.minimum(a, b), np.abs(a) - b, np.minimum(np.maximum(a, -b), b)]
    for k, wk in enumerate(want):
        _bits_equal(got[:, k], np.asarray(wk, np.float16))


def test_half_fma_is_rounded_once_from_the_exact_value():
    rng = np.random.default_rng(6)
    n = 1024
    a, b, c = (np.asarray(rng.standard_normal(n) * 2.0 ** rng.integers(-12, 8, n), np.float16) for _ in range(3))
    # Cases where rounding a * b first, or the float sum, would be a different half: a
    # product just off a half's tie, plus a tiny c that decides the direction.
    a[:4] = np.float16(1.0009765625)  # 1 + 2^-10
    b[:4] = np.float16(1.5)
    c[:4] = np.array([2.0**-12, -(2.0**-12), 2.0**-24, -(2.0**-24)], np.float16)
    (o,) = _run(
        "uint i = thread_position_in_grid.x;\no0[i] = fma(in0[i], in1[i], in2[i]);", [a, b, c], n, [(n, mx.float16)]
    )
    want = np.array(
        [
            _round_exact(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)), 10, -14, 15)
            for x, y, z in zip(a, b, c)
        ],
        np.float16,
    )
    _bits_equal(np.array(o), want)


def _bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> bfloat16 rounded to nearest even (explicitly, on the float64's bits), as
    float32 values (a bfloat16 is a float32's high half). Finite values only."""
    x = np.asarray(x, np.float64)
    b = x.view(np.uint64)
    sign = (b >> np.uint64(63)).astype(bool)
    mag = np.abs(x)
    # The bfloat16 ulp of |x|: 2^(e - 7), e its exponent (|x| = m 2^(e + 1), m in [1/2, 1):
    # frexp, exact), at least -126 (the subnormals').
    e = np.maximum(np.frexp(mag)[1] - 1, -126)
    ulp = np.ldexp(1.0, e - 7)
    q = mag / ulp  # exact: a power-of-two scaling
    r = np.floor(q)
    rem = q - r
    r = np.where((rem > 0.5) | ((rem == 0.5) & (r % 2 == 1)), r + 1, r)
    out = r * ulp
    out = np.where(out >= 2.0**128 * (1 - 2.0**-9), np.inf, out)  # past the largest bfloat16
    return np.where(sign, -out, out).astype(np.float32)


BFLOAT_OPS = """
uint i = thread_position_in_grid.x;
threadgroup bfloat shared[64];
const device bfloat* from = in0 + i;  // a bfloat pointer of the user's (rewrite 3 keeps it in step)
bfloat p = *from, q = in1[i];
shared[thread_position_in_threadgroup.x] = p;
threadgroup_barrier(mem_flags::mem_threadgroup);
bfloat r = shared[63 - thread_position_in_threadgroup.x];
o0[i * 8 + 0] = p * q + p;          // two roundings
o0[i * 8 + 1] = p / q;
bfloat c = p;
c += q; c *= p;
o0[i * 8 + 2] = c;
o0[i * 8 + 3] = p + 257;            // the int rounded to bfloat (256) first
o0[i * 8 + 4] = r - p;
o0[i * 8 + 5] = fma(p, q, r);
o0[i * 8 + 6] = simd_sum(p);
o0[i * 8 + 7] = -q;
o1[i] = p * 3.0f;                   // bfloat op float -> float
"""


def test_bfloat_operations_round_each_result_to_bfloat16():
    rng = np.random.default_rng(7)
    n = 256
    pf = _bf16(rng.standard_normal(n) * 4.0)
    qf = _bf16(rng.standard_normal(n) * 4.0 + 0.5)
    p, q = (mx.array(v).astype(mx.bfloat16) for v in (pf, qf))
    o0, o1 = _run(BFLOAT_OPS, [p, q], n, [(n * 8, mx.bfloat16), (n, mx.float32)])
    got = np.array(o0.astype(mx.float32)).reshape(n, 8)
    P, Q = pf.astype(np.float64), qf.astype(np.float64)
    R = P.reshape(-1, 64)[:, ::-1].reshape(-1)
    c = _bf16(_bf16(P + Q).astype(np.float64) * P)
    # simd_sum: the emulator's butterfly (xor 16, 8, 4, 2, 1), each step rounded to bfloat16.
    t = P.reshape(-1, 32).copy()
    for h in (16, 8, 4, 2, 1):
        t = _bf16(t + t[:, np.arange(32) ^ h]).astype(np.float64)
    exact_fma = [_round_exact(Fraction(x) * Fraction(y) + Fraction(z), 7, -126, 127) for x, y, z in zip(P, Q, R)]
    want = [
        _bf16(_bf16(P * Q).astype(np.float64) + P),
        _bf16(P / Q),
        c,
        _bf16(P + 256.0),
        _bf16(R - P),
        np.array(exact_fma, np.float32),
        t.reshape(-1).astype(np.float32),
        -qf,
    ]
    assert (_bf16(P * Q + P) != want[0]).sum() > 10  # rounded once would differ: the check can fail
    for k, wk in enumerate(want):
        _bits_equal(got[:, k], wk)
    _bits_equal(np.array(o1), (pf * np.float32(3.0)).astype(np.float32))


def test_half_simd_sum_rounds_each_butterfly_step_and_shuffles_move_bits():
    rng = np.random.default_rng(8)
    n = 64
    a = np.asarray(rng.standard_normal(n) * 100, np.float16)
    src = (
        "uint i = thread_position_in_grid.x;\nhalf a = in0[i];\n"
        "o0[i * 2] = simd_sum(a);\no0[i * 2 + 1] = simd_shuffle_xor(a, 3);"
    )
    (o,) = _run(src, [a], n, [(n * 2, mx.float16)])
    got = np.array(o).reshape(n, 2)
    t = a.reshape(-1, 32).copy()
    for h in (16, 8, 4, 2, 1):
        t = t + t[:, np.arange(32) ^ h]  # float16 + float16: numpy rounds each step to half
    _bits_equal(got[:, 0], t.reshape(-1))
    _bits_equal(got[:, 1], a.reshape(-1, 32)[:, np.arange(32) ^ 3].reshape(-1))


VOTES = """
uint i = thread_position_in_grid.x;
if (i % 5 == 4) return;                 // these lanes are not active at the votes
bool up = in0[i] > 0.0f;
simd_vote v = simd_ballot(up);
o0[i * 5 + 0] = uint(ulong(v));
o0[i * 5 + 1] = simd_all(up);
o0[i * 5 + 2] = simd_any(up);
o0[i * 5 + 3] = v.any();
uint all_voted = simd_ballot(true).all();
uint first = simd_is_first();
uint mask_is_ballot = ulong(simd_active_threads_mask()) == ulong(simd_ballot(true));
o0[i * 5 + 4] = all_voted + 2 * first + 4 * mask_is_ballot;
"""


def test_simd_ballot_all_and_any_vote_over_the_active_lanes():
    n = 80  # SIMD-groups of 32, 32 and 16 lanes (a partial one)
    x = np.where(np.arange(n) % 3 == 0, 1.0, -1.0).astype(np.float32)
    x[64:] = 1.0  # the partial SIMD-group: every active lane votes true
    x[32:64] = -1.0  # the second: every lane votes false
    kernel = metal_kernel(name="votes", input_names=["in0"], output_names=["o0"], source=VOTES)
    (o,) = kernel(
        inputs=[mx.array(x)],
        grid=(n, 1, 1),
        threadgroup=(n, 1, 1),
        output_shapes=[(n * 5,)],
        output_dtypes=[mx.uint32],
        init_value=7,
    )
    got = np.array(o).reshape(n, 5)
    for s in range(3):
        lanes = np.arange(s * 32, min(n, s * 32 + 32))
        active = lanes % 5 != 4
        up = (x[lanes] > 0) & active
        ballot = sum(1 << int(k) for k in np.flatnonzero(up))
        want = [ballot, int(up[active].all()), int(up.any()), int(up.any()), 4]  # .all(): some lanes inactive
        want = np.tile(want, (active.sum(), 1))
        want[0, 4] += 2  # simd_is_first: the first active lane alone
        np.testing.assert_array_equal(got[lanes[active]], want)
        np.testing.assert_array_equal(got[lanes[~active]], 7)  # never written
    # Every lane active: ballot(true).all() is true, including in a partial SIMD-group.
    src = (
        "uint i = thread_position_in_grid.x;\n"
        "o0[i] = simd_ballot(true).all() + 2 * uint(ulong(simd_ballot(true)) >> 16);"
    )
    kernel = metal_kernel(name="votes_all", input_names=["in0"], output_names=["o0"], source=src)
    (o,) = kernel(
        inputs=[mx.array(x)], grid=(48, 1, 1), threadgroup=(48, 1, 1), output_shapes=[(48,)], output_dtypes=[mx.uint32]
    )
    np.testing.assert_array_equal(np.array(o), [1 + 2 * 0xFFFF] * 32 + [1] * 16)
