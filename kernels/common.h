// The tail kernels' shared helpers and primitives, written once for both dialects.
//
// Only the prelude's names are used here (KFN, DEV, GRP, THR, GROUP_BARRIER, BITS_F32,
// FMAF, RSQRTF, LOAD_STREAM, UINT4, warp_sum, u32, u16), so the same text compiles as
// Metal and as CUDA. Helpers take values or explicitly qualified pointers and references
// (Metal pointers carry an address space); where x may live in group or in device memory
// the pointer's type is a template parameter.

// Weight formats (template value FMT). A "unit" is the 16 bytes one thread loads at a
// time: 4 float32 weights, 8 bfloat16 weights, 32 4-bit or 16 8-bit codes (MLX's
// quantized layouts: uint32 words along the row, lowest bits first; one scale a group,
// and for affine one bias; see Q_WORD for which words a unit holds).
#define WF_F32 0
#define WF_BF16 1
#define WF_Q4 2   // affine 4-bit: w = scale * q + bias
#define WF_Q8 3   // affine 8-bit: w = scale * q + bias
#define WF_FP4 4  // E2M1 codes (mxfp4, nvfp4): w = scale * e2m1(code); SFMT says the scale's format

// Scale formats (template value SFMT): 0 float32 and 1 bfloat16 (affine scales and
// biases), 2 E8M0 (mxfp4: 2^(s - 127)), 3 E4M3 (nvfp4: an fp8 with 4 exponent bits).
#define SF_F32 0
#define SF_BF16 1
#define SF_E8M0 2
#define SF_E4M3 3

// bfloat16 -> float: the bf16 bits are the high half of the float's.
KFN float bf16_lo(u32 v) { return BITS_F32(v << 16); }
KFN float bf16_hi(u32 v) { return BITS_F32(v & 0xffff0000u); }

// acc + (8 bf16 weights in w) . (a, b)
KFN float dot_bf16x8(uint4 w, float4 a, float4 b, float acc) {
  acc = FMAF(bf16_lo(w.x), a.x, acc);
  acc = FMAF(bf16_hi(w.x), a.y, acc);
  acc = FMAF(bf16_lo(w.y), a.z, acc);
  acc = FMAF(bf16_hi(w.y), a.w, acc);
  acc = FMAF(bf16_lo(w.z), b.x, acc);
  acc = FMAF(bf16_hi(w.z), b.y, acc);
  acc = FMAF(bf16_lo(w.w), b.z, acc);
  acc = FMAF(bf16_hi(w.w), b.w, acc);
  return acc;
}

// acc + (4 float32 weights in w) . a
KFN float dot_f32x4(uint4 w, float4 a, float acc) {
  acc = FMAF(BITS_F32(w.x), a.x, acc);
  acc = FMAF(BITS_F32(w.y), a.y, acc);
  acc = FMAF(BITS_F32(w.z), a.z, acc);
  acc = FMAF(BITS_F32(w.w), a.w, acc);
  return acc;
}

// 4-bit codes, one at a time, each by one mask-and-or and one exact subtract. Code n of
// v (bits 4n .. 4n + 3, n <= 4) placed as it lies into the mantissa of 2^(23 - 4n) makes
// the float 2^(23 - 4n) + q, exactly (its mantissa's last bit is worth 2^-4n there, so
// bit 4n is worth 1); subtracting 2^(23 - 4n) leaves q, exactly. Codes 5-7 (bits 20-31
// reach the exponent) are first moved down 12 bits to the places of codes 2-4. Per code:
// one and_or (one LOP3 on CUDA: the prelude keeps the exponent in a register) and one
// subtract, no shift -- the bfloat16 pairs this replaced cost a shift and two LOP3s a
// code, the ALU pipe the 4-bit launches are bound by (kernels/README.md). The subtract is
// taken before each FMA rather than once a word against the word's sum of x: that would
// round sums about twice as large as the dot and then cancel them, ~4.6x the float32
// error, enough to fail frink-models' 2e-4 on SmolLM2-135M's last layers, where a
// massive activation makes the output a small difference of large terms
// (tests/test_real_model.py).
#define Q4_EXP(n) ((150u - 4u * (n)) << 23)  // the bits of 2^(23 - 4n)
#define Q4_CODE(v, n) (BITS_F32(and_or((v), 0xFu << (4 * (n)), Q4_EXP(n))) - BITS_F32(Q4_EXP(n)))

// acc + sum over the 8 codes of v of q * x, x = (a, b) in element order; the FMAs run in
// the order 0, 4, 1, 5, 2, 6, 3, 7 (the order of the bfloat16-pair form before it, so the
// sums' bits did not move).
KFN float dot_q4x8(u32 v, float4 a, float4 b, float acc) {
  const u32 h = v >> 12;  // codes 5, 6, 7 at the places of 2, 3, 4
  acc = FMAF(Q4_CODE(v, 0), a.x, acc);
  acc = FMAF(Q4_CODE(v, 4), b.x, acc);
  acc = FMAF(Q4_CODE(v, 1), a.y, acc);
  acc = FMAF(Q4_CODE(h, 2), b.y, acc);
  acc = FMAF(Q4_CODE(v, 2), a.z, acc);
  acc = FMAF(Q4_CODE(h, 3), b.z, acc);
  acc = FMAF(Q4_CODE(v, 3), a.w, acc);
  acc = FMAF(Q4_CODE(h, 4), b.w, acc);
  return acc;
}

KFN float sum8(float4 a, float4 b) { return ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)); }

// 8-bit codes, one at a time: the byte in the top eight mantissa bits of a float32 is
// 1 + q/256, exactly; the "1 +" is taken off each value before its FMA, as for 4-bit.
#define Q8_MASK 0x007F8000u
#define F32_ONE 0x3F800000u

// acc + sum over the 4 codes of v of (q/256) * x, x = a in element order.
KFN float dot_q8x4(u32 v, float4 a, float acc) {
  acc = FMAF(BITS_F32(((v << 15) & Q8_MASK) | F32_ONE) - 1.0f, a.x, acc);
  acc = FMAF(BITS_F32(((v << 7) & Q8_MASK) | F32_ONE) - 1.0f, a.y, acc);
  acc = FMAF(BITS_F32(((v >> 1) & Q8_MASK) | F32_ONE) - 1.0f, a.z, acc);
  acc = FMAF(BITS_F32(((v >> 9) & Q8_MASK) | F32_ONE) - 1.0f, a.w, acc);
  return acc;
}

// E2M1 codes (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1, 1.5, 2, 3, 4, 6 and
// their negatives), two at a time as the IEEE halves of one word: codes n and n + 4 of v
// (nibbles n and n + 4, n < 4) with their three magnitude bits (e1 e0 m) moved to bits
// 9-11 of each half and their sign to bit 15. Such a half is e2m1 * 2^-14 exactly (e > 0:
// 2^(e - 15) (1 + m/2); e = 0: the subnormal m 2^-15 = (m/2) 2^-14), and converts to a
// float exactly (half_lo / half_hi). Subnormal halves survive that conversion on both
// GPUs: MLX's own Metal kernels read E2M1 and E4M3 through them the same way
// (mlx/backend/metal/kernels/fp4.h, fp8.h), and the CUDA prelude's conversion is an
// explicit cvt without flush-to-zero.
// Per pair: a shift for the magnitudes, one for the signs (none for n = 3) and two LOP3s,
// where the byte table this replaced (three byte_perms for four codes, their selectors
// and tables in registers, then a mask-and-or and a subtract a code) cost the ALU pipe,
// which bounds the fp4 launches (kernels/README.md), about twice as much. The FMAs now
// take values 2^-15 times the table's 2 e2m1: a power of two, so every partial sum is
// that factor times the old one, exactly, and FP4_UNSCALE (2^14, with the old 1/2) puts
// it back: the same bits.
#define FP4_MAG2 0x0E000E00u   // bits 9-11 of each half
#define FP4_SIGN2 0x80008000u  // bit 15 of each half
#define FP4_UNSCALE 16384.0f   // 2^14: dot_fp4x8's sums times this are sum e2m1 x

// Codes N and N + 4 of v as a half pair (N a constant, 0-3).
template <int N>
KFN u32 fp4_pair(u32 v) {
  const u32 mag = N < 3 ? v << (9 - 4 * N) : v >> 3;  // bit 4N -> 9 (and 4N + 16 -> 25)
  const u32 sgn = v << (12 - 4 * N);                  // bit 4N + 3 -> 15 (and 31)
  return and_or(mag, FP4_MAG2, sgn & FP4_SIGN2);
}

// acc + sum over the 8 codes of v of (e2m1 2^-14) * x, x = (a, b) in element order.
KFN float dot_fp4x8(u32 v, float4 a, float4 b, float acc) {
  const u32 p0 = fp4_pair<0>(v), p1 = fp4_pair<1>(v), p2 = fp4_pair<2>(v), p3 = fp4_pair<3>(v);
  acc = FMAF(half_lo(p0), a.x, acc);
  acc = FMAF(half_lo(p1), a.y, acc);
  acc = FMAF(half_lo(p2), a.z, acc);
  acc = FMAF(half_lo(p3), a.w, acc);
  acc = FMAF(half_hi(p0), b.x, acc);
  acc = FMAF(half_hi(p1), b.y, acc);
  acc = FMAF(half_hi(p2), b.z, acc);
  acc = FMAF(half_hi(p3), b.w, acc);
  return acc;
}

// E8M0 (mxfp4's scale): 2^(s - 127), the byte as a float's exponent (s = 0: 2^-127).
KFN float e8m0_float(u32 s) { return s ? BITS_F32(s << 23) : BITS_F32(0x00400000u); }

// E4M3 (nvfp4's scale): sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
// subnormal (m / 8 * 2^-6). Its seven low bits moved to bits 7-13 of a half and its sign
// to bit 15 make the half e4m3 * 2^-8 exactly, subnormals included (as fp4_pair's codes);
// times 256 after the exact conversion. (0x7F, E4M3's NaN, comes out 480, as before.)
KFN float e4m3_float(u32 v) {
  return half_lo(and_or(v << 7, 0x3F80u, (v << 8) & 0x8000u)) * 256.0f;
}

// Weight elements per unit (16 bytes).
#define UNIT_ELEMS(FMT) ((FMT) == WF_F32 ? 4 : ((FMT) == WF_BF16 ? 8 : ((FMT) == WF_Q8 ? 16 : 32)))

// Which uint32 word of a quantized row holds the k-th word of unit u (four words a unit in
// every quantized format). Contiguous (QI false): 4u + k. Interleaved (QI true, rows of a
// multiple of 128 words): the 32 lanes that load units 32c .. 32c + 31 together read words
// 128c + lane + 32k, so each of the four loads is one contiguous 128-byte line per warp and
// each lane's x (8 floats a 4-bit word, 4 an 8-bit one) sits 32 (16) bytes from its
// neighbour's -- not 128 (64), which made every x read a many-way bank conflict.
#define Q_WORD(QI, u, k) ((QI) ? ((((u) >> 5) << 7) + ((u) & 31) + 32 * (k)) : (4 * (u) + (k)))

// ---- the primitives the bodies are written in -----------------------------------------
//
// A body names its steps: load a first batch early (load_batch), build its input vector
// in group memory (scatter_signed, rms_inv / rms_prologue, group_hadamard), then dot
// every row it owns against it (warp_dot / lane_dot). Everything is a template or an
// inline function, so each call compiles to the straight-line code the bodies used to
// spell out; group memory stays declared in the bodies (Metal allows threadgroup
// declarations only at kernel scope) and is passed in as GRP pointers.

// The quantized formats whose rows read x tiled (TiledX, below) where x is in group
// memory (wo, gate_up, the head launch); the others keep the per-word form. Measured on
// the H200 (kernels/README.md, "The quantized inner loop"): tiled, affine 8-bit's gate_up
// ran 0.62x its per-word time; the 4-bit formats gained at most 4% and mxfp4's wo lost
// 24%: a tiled unit holds its 32 floats of x in registers, 56-80 a thread where the
// per-word form needs 32-56, and mxfp4's wo (68) no longer fits two 512-thread groups an
// SM. workbench/kernel_launch.py (TILED_X_FORMATS) mirrors this line.
#define TILED_X(FMT) ((FMT) == WF_Q8)

// A weight matrix's format and row length, fixed at compile time: FMT / SFMT / GS / QI
// as the launch's template values, COLS the row's length in weights; XGROUP: the row dot
// reads x from group memory (so a TILED_X format reads it tiled, and contiguous units:
// QI is then false). Enumerators rather than static members, which every dialect accepts
// in a struct.
template <int FMT_, int SFMT_, int GS_, bool QI_, int COLS_, bool XGROUP_ = false>
struct WFormat {
  enum {
    FMT = FMT_,
    SFMT = SFMT_,
    GS = GS_,
    COLS = COLS_,
    UR = COLS_ / UNIT_ELEMS(FMT_),  // 16-byte units a row
    KG = COLS_ / GS_,               // quantization groups a row
    UE = UNIT_ELEMS(FMT_),          // weights a unit
    TILED = FMT_ >= WF_Q4 && XGROUP_ && TILED_X(FMT_),  // x read as TiledX
    QI = QI_ && !TILED,
    // A tiled row: the sum of x over each SB weights (a unit, or a scale group when a
    // unit holds two: nvfp4), NSB of them a unit.
    SB = GS_ < UE ? GS_ : UE,
    NSB = UE / SB,
    // float4s x takes in group memory (whole 128-byte lines when tiled: the swizzle
    // permutes within a line) and the SB-sums after it (none unless tiled).
    XL4 = TILED ? ((COLS_ / 4 + 7) / 8) * 8 : COLS_ / 4,
    SUM4 = TILED ? (COLS_ / SB + 3) / 4 : 0
  };
};

// The storage of one scale or bias (SFMT): float32, bfloat16 (its 16 bits), or a byte
// (E8M0, E4M3).
template <int SFMT>
struct SBElem {
  typedef float T;
};
template <>
struct SBElem<SF_BF16> {
  typedef u16 T;
};
template <>
struct SBElem<SF_E8M0> {
  typedef u8 T;
};
template <>
struct SBElem<SF_E4M3> {
  typedef u8 T;
};
// A stored scale's bits, widened to 32 (one overload a storage type, so none is ambiguous).
KFN u32 sb_bits(float v) { return F32_BITS(v); }
KFN u32 sb_bits(u16 v) { return (u32)v; }
KFN u32 sb_bits(u8 v) { return (u32)v; }
// Those bits as the float they code.
template <int SFMT>
KFN float sb_float(u32 v) {
  if (SFMT == SF_BF16) {
    return BITS_F32(v << 16);
  }
  if (SFMT == SF_E8M0) {
    return e8m0_float(v);
  }
  if (SFMT == SF_E4M3) {
    return e4m3_float(v);
  }
  return BITS_F32(v);
}

// A row view of a quantized matrix's scales and biases (one of each per GS weights; the
// fp4 formats have no bias, and their view's b is never read). One typed pointer pair
// instead of one view a storage type; dense formats carry one too (pointing at an unused
// dummy), never read.
template <int SFMT>
struct SBRow {
  typedef typename SBElem<SFMT>::T T;
  const DEV T* s;
  const DEV T* b;
  KFN float scale(int g) const { return sb_float<SFMT>(sb_bits(s[g])); }
  KFN float bias(int g) const { return sb_float<SFMT>(sb_bits(b[g])); }
  // The view from group g on: a unit's words then read their scales at constant offsets.
  KFN SBRow from(int g) const {
    SBRow r;
    r.s = s + g;
    r.b = b + g;
    return r;
  }
};

// NR weight rows that one lane walks side by side (gate_up reads row r of gate AND of up
// with one set of x reads): each row's 16-byte units and its scale/bias view.
template <typename F, int NR>
struct WRows {
  const DEV uint4* w[NR];
  SBRow<F::SFMT> sb[NR];
};

// Row r of the matrix whose weights / scales / biases are the kernel inputs w / s / b (b
// may be typed differently: the fp4 formats pass a float32 dummy for their absent biases).
template <typename F, typename WP, typename SP, typename BP>
KFN WRows<F, 1> weight_row(WP w, SP s, BP b, int r) {
  typedef typename SBElem<F::SFMT>::T T;
  WRows<F, 1> row;
  row.w[0] = (const DEV uint4*)w + r * F::UR;
  row.sb[0].s = (const DEV T*)s + r * F::KG;
  row.sb[0].b = (const DEV T*)b + r * F::KG;
  return row;
}

// Rows r0 .. r0 + NR - 1 of the matrix, walked together (ffn_down's rows of a group).
template <typename F, int NR, typename WP, typename SP, typename BP>
KFN WRows<F, NR> weight_rows(WP w, SP s, BP b, int r0) {
  typedef typename SBElem<F::SFMT>::T T;
  WRows<F, NR> rows;
  UNROLL for (int k = 0; k < NR; ++k) {
    rows.w[k] = (const DEV uint4*)w + (r0 + k) * F::UR;
    rows.sb[k].s = (const DEV T*)s + (r0 + k) * F::KG;
    rows.sb[k].b = (const DEV T*)b + (r0 + k) * F::KG;
  }
  return rows;
}

// Two rows walked together (a's units first in every batch, then b's).
template <typename F>
KFN WRows<F, 2> row_pair(WRows<F, 1> a, WRows<F, 1> b) {
  WRows<F, 2> p;
  p.w[0] = a.w[0];
  p.sb[0] = a.sb[0];
  p.w[1] = b.w[0];
  p.sb[1] = b.sb[0];
  return p;
}

// A lane's batch: U units of each of NR rows in registers, all loads issued before any
// is used (so U x NR 16-byte loads are in flight a lane). With EARLY, a body may load a
// row's first batch BEFORE its prologue (`loaded`), and that row's dot product then
// starts from it instead of loading. Without EARLY the flag is a constant false, so the
// compiler sees one plain loop (a runtime flag makes it peel the first batch off).
template <int NR, int U, bool EARLY>
struct WBatch {
  uint4 v[NR][U];
  bool loaded;
  KFN WBatch() : loaded(false) {}
};

// The per-row sums a dot product returns.
template <int NR>
struct RowSums {
  float v[NR];
};

// Unit u of the row at wr: its 16 bytes, or for interleaved quantized rows its four words
// gathered (Q_WORD).
template <typename F>
KFN uint4 load_unit(const DEV uint4* wr, int u) {
  if (F::FMT >= WF_Q4 && F::QI) {
    // Word 0's address once, the others 32 words on from it: four loads at constant
    // offsets from one pointer (LOAD_STREAM_AT says why not LOAD_STREAM(p + 32 k)).
    const DEV u32* p = (const DEV u32*)wr + Q_WORD(true, u, 0);
    return UINT4(LOAD_STREAM_AT(p, 0), LOAD_STREAM_AT(p, 32), LOAD_STREAM_AT(p, 64), LOAD_STREAM_AT(p, 96));
  }
  return LOAD_STREAM(wr + u);
}

// Whether a thread starting at unit u0 has a whole batch (U units, STRIDE apart) left in
// a row: the condition of the batched loop, and so of loading a first batch early.
template <typename F, int U, int STRIDE>
KFN bool full_batch(int u0) {
  return u0 + STRIDE * (U - 1) < F::UR;
}

// Loads units u0, u0 + STRIDE, ..., u0 + (U - 1) STRIDE of each row into batch, in that
// order (for each unit, every row's load), and marks it loaded.
template <int U, int STRIDE, typename F, int NR, bool EARLY>
KFN void load_batch(THR WBatch<NR, U, EARLY>& batch, WRows<F, NR> rows, int u0) {
  UNROLL for (int j = 0; j < U; ++j) {
    UNROLL for (int k = 0; k < NR; ++k) {
      batch.v[k][j] = load_unit<F>(rows.w[k], u0 + STRIDE * j);
    }
  }
  batch.loaded = true;
}

// The scale groups of a unit's words. Word k of unit u is word Q_WORD(QI, u, 0) + k
// Q_WORD_STEP(QI), and its group is word 0's plus group_step<F>(k), a constant: in an
// interleaved row 32 k words (WORD_ELEMS * 32 k weights) on, a whole number of groups
// (GS a power of two up to 128); in a contiguous one k words on, the same group while a
// unit lies within one (GS >= UE), else (nvfp4: GS 16, two groups a unit) k / 2 on. So a
// unit finds its first group once (unsigned: a shift, where a signed division by GS cost
// three instructions and hid the constant offsets) and reads every word's scale and bias
// at a constant offset from it.
#define Q_WORD_STEP(QI) ((QI) ? 32 : 1)
#define WORD_ELEMS(FMT) ((FMT) == WF_Q8 ? 4 : 8)

template <typename F>
KFN int first_group(int w0) {
  static_assert((F::GS & (F::GS - 1)) == 0 && F::GS >= 8 && F::GS <= 128,
                "group_step needs a power-of-two group size, 8 to 128 weights");
  return (int)(((u32)w0 * (u32)WORD_ELEMS(F::FMT)) / (u32)F::GS);
}

template <typename F>
KFN int group_step(int k) {
  return F::QI ? (WORD_ELEMS(F::FMT) * 32 * k) / F::GS : (F::GS >= F::UE ? 0 : (WORD_ELEMS(F::FMT) * k) / F::GS);
}

// One 4-bit word (8 codes, elements 8 wi ..) into acc: scale * (q . x) + bias * sum(x),
// the scale and bias of group g of sb.
template <int SFMT, typename XP>
KFN float q4_word_dot(u32 v, XP x4, int wi, float acc, SBRow<SFMT> sb, int g) {
  const float4 xa = x4[2 * wi], xb = x4[2 * wi + 1];
  const float sx = sum8(xa, xb);
  const float d = dot_q4x8(v, xa, xb, 0.0f);  // sum q x
  return FMAF(sb.scale(g), d, FMAF(sb.bias(g), sx, acc));
}

// One 8-bit word (4 codes, elements 4 wi ..) into acc: scale * (q . x) + bias * sum(x).
template <int SFMT, typename XP>
KFN float q8_word_dot(u32 v, XP x4, int wi, float acc, SBRow<SFMT> sb, int g) {
  const float4 xa = x4[wi];
  const float sx = (xa.x + xa.y) + (xa.z + xa.w);
  const float d = dot_q8x4(v, xa, 0.0f);  // sum (q/256) x
  return FMAF(256.0f * sb.scale(g), d, FMAF(sb.bias(g), sx, acc));
}

// One E2M1 word (8 codes, elements 8 wi ..) into acc: scale * (e2m1 . x), from
// dot_fp4x8's sum times FP4_UNSCALE (exact). (No sum of x: fp4 has no bias.)
template <int SFMT, typename XP>
KFN float fp4_word_dot(u32 v, XP x4, int wi, float acc, SBRow<SFMT> sb, int g) {
  const float4 xa = x4[2 * wi], xb = x4[2 * wi + 1];
  const float d = dot_fp4x8(v, xa, xb, 0.0f);
  return FMAF(sb.scale(g), d * FP4_UNSCALE, acc);
}

// acc + (unit u of a row, its 16 bytes already loaded into w) . x, where x4 indexes x as
// float4 (a GRP or DEV pointer: group memory in wo / gate_up / head, device memory in
// down, whose 17408-long input does not fit 32 KB of Metal threadgroup memory).
template <typename F, typename XP>
KFN float unit_dot(uint4 w, XP x4, int u, float acc, SBRow<F::SFMT> sb) {
  if (F::FMT == WF_BF16) {
    return dot_bf16x8(w, x4[2 * u], x4[2 * u + 1], acc);
  }
  if (F::FMT == WF_F32) {
    return dot_f32x4(w, x4[u], acc);
  }
  const int w0 = Q_WORD(F::QI, u, 0);
  const int ws = Q_WORD_STEP(F::QI);
  const SBRow<F::SFMT> at = sb.from(first_group<F>(w0));
  if (F::FMT == WF_Q8) {
    acc = q8_word_dot(w.x, x4, w0, acc, at, group_step<F>(0));
    acc = q8_word_dot(w.y, x4, w0 + ws, acc, at, group_step<F>(1));
    acc = q8_word_dot(w.z, x4, w0 + 2 * ws, acc, at, group_step<F>(2));
    return q8_word_dot(w.w, x4, w0 + 3 * ws, acc, at, group_step<F>(3));
  }
  if (F::FMT == WF_FP4) {
    acc = fp4_word_dot(w.x, x4, w0, acc, at, group_step<F>(0));
    acc = fp4_word_dot(w.y, x4, w0 + ws, acc, at, group_step<F>(1));
    acc = fp4_word_dot(w.z, x4, w0 + 2 * ws, acc, at, group_step<F>(2));
    return fp4_word_dot(w.w, x4, w0 + 3 * ws, acc, at, group_step<F>(3));
  }
  acc = q4_word_dot(w.x, x4, w0, acc, at, group_step<F>(0));
  acc = q4_word_dot(w.y, x4, w0 + ws, acc, at, group_step<F>(1));
  acc = q4_word_dot(w.z, x4, w0 + 2 * ws, acc, at, group_step<F>(2));
  acc = q4_word_dot(w.w, x4, w0 + 3 * ws, acc, at, group_step<F>(3));
  return acc;
}

// ---- quantized rows against x in group memory (wo, gate_up, the head launch) -----------
//
// The per-word form above pays, for every 32-bit word, the word's sum of x (7 adds for 8
// codes, for the bias) and a scale (and bias) decode, and 4-byte loads. Against x in
// group memory a lane instead takes whole 16-byte units: one load, every word of a unit
// in one scale group (two for nvfp4's groups of 16), so a unit costs one FMA a weight
// plus, once a unit, a scale decode and the bias times the unit's sum of x, read
// from SB-sums that each group computes once (tile_x) rather than added up per word.
// A lane's unit reads 32 (4-bit) or 16 (8-bit) contiguous floats of x, so neighbouring
// lanes' x sit 128 (64) bytes apart: every 16-byte read an 8-way (4-way) bank conflict.
// tile_x therefore also swizzles x within each 128-byte line, float4 f to slot XSWZ(f):
// the 8 lanes of each quarter-warp read (units u .. u + 7) then hit 8 different 16-byte
// bank groups.
#define XSWZ(f) ((f) ^ (((f) >> 3) & 7))

// The four floats of v summed, one fixed order.
KFN float hsum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// The sum of SB (32 or 16) consecutive floats, v[0 .. SB/4 - 1], one fixed order.
template <int SB>
KFN float block_sum(const THR float4* v) {
  const float lo = (hsum4(v[0]) + hsum4(v[1])) + (hsum4(v[2]) + hsum4(v[3]));
  if (SB == 16) {
    return lo;
  }
  return lo + ((hsum4(v[4]) + hsum4(v[5])) + (hsum4(v[6]) + hsum4(v[7])));
}

// x in group memory made ready for F's quantized rows; every thread calls it after the
// prologue's closing barrier. Each thread takes whole 128-byte lines, writes their
// SB-sums to xsum when SUMS, and puts float4 8 line + j at slot j ^ (line & 7). (Every
// served quantized row is a multiple of 32 weights: 4-bit units, 8-bit groups. A last
// half line would be carried along with the array's padding, F::XL4, and never read.)
// Other formats read x as it is: nothing to do.
template <typename F, int W, int NT, bool SUMS>
KFN void tile_x(GRP float4* xs4, GRP float* xsum, int lid) {
  if (!F::TILED) {
    return;
  }
  for (int line = lid; line < F::XL4 / 8; line += NT) {
    float4 v[8];
    UNROLL for (int j = 0; j < 8; ++j) {
      v[j] = xs4[8 * line + j];
    }
    if (SUMS) {
      UNROLL for (int b = 0; b < 32 / F::SB; ++b) {
        const int i = line * (32 / F::SB) + b;
        if (i < W / F::SB) {
          xsum[i] = block_sum<F::SB>(v + b * (F::SB / 4));
        }
      }
    }
    UNROLL for (int j = 0; j < 8; ++j) {
      xs4[8 * line + (j ^ (line & 7))] = v[j];
    }
  }
  GROUP_BARRIER();
}

// x as tile_x left it: the swizzled lines, and the SB-sums when they fit (SUMS; else
// each lane adds up its unit's x, at widths where x alone fills Metal's 32 KB).
template <bool SUMS>
struct TiledX {
  const GRP float4* x4;
  const GRP float* sums;
};

// What a body passes its row dots as x: TiledX for a tiled F, else the group-memory array
// as it is (the row dot then compiles to the per-unit / per-word form above).
template <typename F, bool SUMS, bool Q = (F::TILED != 0)>
struct XView {
  typedef const GRP float4* T;
  static KFN T make(GRP float4* x4, GRP float* sums) { return x4; }
};
template <typename F, bool SUMS>
struct XView<F, SUMS, true> {
  typedef TiledX<SUMS> T;
  static KFN T make(GRP float4* x4, GRP float* sums) {
    T t;
    t.x4 = x4;
    t.sums = sums;
    return t;
  }
};

// One unit's x in registers: its floats in element order (4-bit: v[0..7], 8-bit: v[0..3])
// and its SB-sums (s[0], and s[1] when a unit holds two scale groups).
struct XUnit {
  float4 v[8];
  float s[2];
};

// acc + (unit u of a quantized row, its 16 bytes in w) . x, x the unit's XUnit: each
// word's code dot on its own (four independent chains), then per sum block the scale
// decoded once: affine k s t + bias sum x (t = sum q x and k = 1 for 4-bit, t = sum
// (q/256) x and k = 256 for 8-bit), fp4 s (FP4_UNSCALE t) (t = sum (e2m1 2^-14) x).
template <typename F>
KFN float tiled_unit_dot(uint4 w, XUnit xu, int u, float acc, SBRow<F::SFMT> sb) {
  float d[4];
  if (F::FMT == WF_Q8) {
    d[0] = dot_q8x4(w.x, xu.v[0], 0.0f);
    d[1] = dot_q8x4(w.y, xu.v[1], 0.0f);
    d[2] = dot_q8x4(w.z, xu.v[2], 0.0f);
    d[3] = dot_q8x4(w.w, xu.v[3], 0.0f);
  } else if (F::FMT == WF_FP4) {
    d[0] = dot_fp4x8(w.x, xu.v[0], xu.v[1], 0.0f);
    d[1] = dot_fp4x8(w.y, xu.v[2], xu.v[3], 0.0f);
    d[2] = dot_fp4x8(w.z, xu.v[4], xu.v[5], 0.0f);
    d[3] = dot_fp4x8(w.w, xu.v[6], xu.v[7], 0.0f);
  } else {
    d[0] = dot_q4x8(w.x, xu.v[0], xu.v[1], 0.0f);
    d[1] = dot_q4x8(w.y, xu.v[2], xu.v[3], 0.0f);
    d[2] = dot_q4x8(w.z, xu.v[4], xu.v[5], 0.0f);
    d[3] = dot_q4x8(w.w, xu.v[6], xu.v[7], 0.0f);
  }
  float t[2];
  if (F::NSB == 1) {
    t[0] = (d[0] + d[1]) + (d[2] + d[3]);
  } else {
    t[0] = d[0] + d[1];
    t[1] = d[2] + d[3];
  }
  UNROLL for (int b = 0; b < F::NSB; ++b) {
    const int g = (u * F::UE + b * F::SB) / F::GS;
    const float s = sb.scale(g);
    const float sx = xu.s[b];
    if (F::FMT == WF_FP4) {
      acc = FMAF(s, t[b] * FP4_UNSCALE, acc);
    } else {
      const float k = F::FMT == WF_Q8 ? 256.0f : 1.0f;
      acc = FMAF(k * s, t[b], FMAF(sb.bias(g), sx, acc));
    }
  }
  return acc;
}

// How a row dot reads x, one unit at a time: `unit(u)` fetches what unit u needs, `dot`
// adds the unit's product. Plain float4 arrays (dense formats; down's x in device
// memory): the array itself, unit_dot reading from it.
template <typename F, typename XP>
struct XReader {
  typedef XP Unit;
  XP x;
  KFN XReader(XP x_, int first) : x(x_) { (void)first; }
  KFN Unit unit(int u) const {
    (void)u;
    return x;
  }
  KFN float dot(uint4 w, Unit xu, int u, float acc, SBRow<F::SFMT> sb) const {
    return unit_dot<F>(w, xu, u, acc, sb);
  }
};

// TiledX: the unit's x from its swizzled line. A lane's units are first + a multiple of
// the row dot's STRIDE (a multiple of 16), so the unit's place in its 128-byte line and
// the line's swizzle key are the same for all of them: lo and m, computed once.
template <typename F, bool SUMS>
struct XReader<F, TiledX<SUMS> > {
  typedef XUnit Unit;
  TiledX<SUMS> x;
  int lo;  // the unit's first float4 within its line
  int m;   // the line's swizzle key (line & 7)
  KFN XReader(TiledX<SUMS> x_, int first)
      : x(x_), lo((first * (F::UE / 4)) & 7), m(((first * (F::UE / 4)) >> 3) & 7) {}
  KFN Unit unit(int u) const {
    XUnit xu;
    const GRP float4* line = x.x4 + ((u * (F::UE / 4)) & ~7);
    UNROLL for (int j = 0; j < F::UE / 4; ++j) {
      xu.v[j] = line[(lo + j) ^ m];
    }
    UNROLL for (int b = 0; b < F::NSB; ++b) {
      xu.s[b] = SUMS ? x.sums[u * F::NSB + b] : block_sum<F::SB>(xu.v + b * (F::SB / 4));
    }
    return xu;
  }
  KFN float dot(uint4 w, Unit xu, int u, float acc, SBRow<F::SFMT> sb) const {
    return tiled_unit_dot<F>(w, xu, u, acc, sb);
  }
};

// THE ROW DOT: this thread's part of (each of the NR rows) . x, the thread taking units
// first, first + STRIDE, ... of every row. Full batches first: U units of each row loaded
// before any is used (the loads are what keep device memory busy), or taken from `batch`
// when it was loaded early; then the rest one unit at a time. Each row's sum is
// accumulated in unit order, units in element order. The caller reduces the partial sums
// (warp_dot: a warp a row; ffn_down: group_sum, a group a row).
template <int STRIDE, typename F, int NR, int U, bool EARLY, typename XP>
KFN RowSums<NR> lane_dot(WRows<F, NR> rows, XP x4, int first, THR WBatch<NR, U, EARLY>& batch) {
  static_assert(STRIDE % 16 == 0, "XReader<TiledX> needs a lane's units 16 apart or a multiple of that");
  const XReader<F, XP> xr(x4, first);
  RowSums<NR> acc;
  UNROLL for (int k = 0; k < NR; ++k) {
    acc.v[k] = 0.0f;
  }
  int u0 = first;
  // A plain local copy of the flag: the compiler sees it false after the first batch and
  // peels that batch off the loop (the steady loop then loads unconditionally), as it did
  // when the bodies held this flag in a bool of their own; testing batch.loaded in the
  // loop made it keep the test in every batch instead.
  bool pre = EARLY && batch.loaded;
  for (; full_batch<F, U, STRIDE>(u0); u0 += STRIDE * U) {
    if (!pre) {
      load_batch<U, STRIDE>(batch, rows, u0);
    }
    pre = false;
    UNROLL for (int j = 0; j < U; ++j) {
      const typename XReader<F, XP>::Unit xu = xr.unit(u0 + STRIDE * j);  // one x read for all NR rows
      UNROLL for (int k = 0; k < NR; ++k) {
        acc.v[k] = xr.dot(batch.v[k][j], xu, u0 + STRIDE * j, acc.v[k], rows.sb[k]);
      }
    }
  }
  for (; u0 < F::UR; u0 += STRIDE) {
    WBatch<NR, 1, false> one;
    load_batch<1, STRIDE>(one, rows, u0);
    const typename XReader<F, XP>::Unit xu = xr.unit(u0);
    UNROLL for (int k = 0; k < NR; ++k) {
      acc.v[k] = xr.dot(one.v[k][0], xu, u0, acc.v[k], rows.sb[k]);
    }
  }
  batch.loaded = false;  // an early batch belongs to this row only
  return acc;
}

// Rows owned by one warp: lane_dot with the 32 lanes striding the row, then each row's
// sum in every lane.
template <typename F, int NR, int U, bool EARLY, typename XP>
KFN RowSums<NR> warp_dot(WRows<F, NR> rows, XP x4, int lane, THR WBatch<NR, U, EARLY>& batch) {
  RowSums<NR> s = lane_dot<32>(rows, x4, lane, batch);
  UNROLL for (int k = 0; k < NR; ++k) {
    s.v[k] = warp_sum(s.v[k]);
  }
  return s;
}

// The sum of v over the NT threads of a group, in every thread, in one fixed order
// (so every thread gets the same bits, run after run). red holds NT/32 floats; the
// trailing barrier lets the caller reuse it.
template <int NT>
KFN float group_sum(float v, GRP float* red, int lane, int warp) {
  v = warp_sum(v);
  if (lane == 0) {
    red[warp] = v;
  }
  GROUP_BARRIER();
  float t = 0.0f;
  for (int i = 0; i < NT / 32; ++i) {
    t += red[i];
  }
  GROUP_BARRIER();
  return t;
}

// group_sum for NR values at once (the same fixed order for each, so the same bits as NR
// group_sums), with two barriers instead of 2 NR. red holds NR * NT/32 floats; the result
// is in every thread.
template <int NT, int NR>
KFN RowSums<NR> group_sums(RowSums<NR> v, GRP float* red, int lane, int warp) {
  UNROLL for (int k = 0; k < NR; ++k) {
    const float s = warp_sum(v.v[k]);
    if (lane == 0) {
      red[k * (NT / 32) + warp] = s;
    }
  }
  GROUP_BARRIER();
  RowSums<NR> t;
  UNROLL for (int k = 0; k < NR; ++k) {
    t.v[k] = 0.0f;
    for (int i = 0; i < NT / 32; ++i) {
      t.v[k] += red[k * (NT / 32) + i];
    }
  }
  GROUP_BARRIER();
  return t;
}

// x <- blockdiag(H_b) x in group memory, unnormalised (the caller scales by
// 1/sqrt(b)), for b = M * 2^LOGP: H_b = kron(H_M, H_{2^LOGP}) applied as y = H_b x
// (MLX's mx.hadamard_transform). Viewing each block as an M x 2^LOGP row-major array X,
// that is H_M X H_{2^LOGP}: a Walsh-Hadamard butterfly along the rows (LOGP stages, pair
// distance h = 1, 2, .., 2^LOGP / 2: every aligned run of 2^LOGP elements), then the
// M x M table (row-major +-1, `table`) mixing the rows. Every thread of the group calls this.
//
// The butterfly stages run in order h = 1, 2, 4, ..., each pair (a, b) becoming (a + b,
// a - b), so the result has the same bits as one pass through group memory a stage; but
// most stages never touch group memory (measured on the H200: ten such passes, each with
// its barrier, kept Bonsai's wo launch at ~2 TB/s):
//  1. warp_butterflies: a warp reads a chunk of 32 C contiguous elements (lane l holding
//     elements l + 32 c, c < C: coalesced, no bank conflict), does the stages h < 32 by
//     lane shuffles and h = 32 .. 16 C in registers, and writes the chunk back;
//  2. radix_butterflies: the stages left (h >= 32 C, when a run is longer than a chunk)
//     in passes of up to three, each thread taking the 2^S elements a pass mixes
//     (base + k h0), so a pass reads and writes group memory once and ends in a barrier.
// Bonsai-27B (LOGP = 10): eight stages in the warps, two in one radix-4 pass; two
// barriers instead of ten.

// log2 of the elements a lane holds in warp_butterflies: 8 (a chunk of 256) or fewer
// when a run is shorter (a chunk then holds whole runs).
#define WARP_LOGC(LOGP) ((LOGP) >= 8 ? 3 : ((LOGP) > 5 ? (LOGP) - 5 : 0))

// The butterfly stages of a thread's own 2^S values, t = 0 .. S - 1 in order, pairs (k,
// k + 2^t), each pair (a, b) becoming (a + b, a - b). v is the caller's register array
// (the call is inlined, so it stays in registers).
template <int S>
KFN void register_butterflies(THR float* v) {
  UNROLL for (int t = 0; t < S; ++t) {
    UNROLL for (int k = 0; k < (1 << S); ++k) {
      if ((k & (1 << t)) == 0) {
        const float a = v[k], b = v[k + (1 << t)];
        v[k] = a + b;
        v[k + (1 << t)] = a - b;
      }
    }
  }
}

// Stages h = 1 .. min(2^LOGP, 32 C) / 2 of every run, a warp a chunk of 32 C elements.
// WIDTH is a multiple of 2^LOGP; a last chunk past WIDTH holds whole runs (its lanes past
// the end carry zeros through the shuffles and store nothing).
template <int WIDTH, int LOGP, int NT>
KFN void warp_butterflies(GRP float* x, int lid) {
  const int LC = WARP_LOGC(LOGP);
  const int C = 1 << LC;
  const int CH = 32 * C;
  const int LANE_STAGES = LOGP < 5 ? LOGP : 5;  // h = 1 .. 16 (fewer when a run is shorter)
  const int lane = lid & 31;
  for (int ch = lid >> 5; ch < (WIDTH + CH - 1) / CH; ch += NT / 32) {  // warp-uniform
    float v[C];
    UNROLL for (int c = 0; c < C; ++c) {
      const int i = ch * CH + 32 * c + lane;
      v[c] = i < WIDTH ? x[i] : 0.0f;
    }
    UNROLL for (int t = 0; t < LANE_STAGES; ++t) {  // the partner is in lane ^ h
      const int h = 1 << t;
      UNROLL for (int c = 0; c < C; ++c) {
        const float p = lane_xor(v[c], h);
        v[c] = (lane & h) ? p - v[c] : v[c] + p;  // upper: a - b (p = a); lower: a + b
      }
    }
    register_butterflies<LC>(v);  // h = 32 << t: the partner is in register c + 2^t
    UNROLL for (int c = 0; c < C; ++c) {
      const int i = ch * CH + 32 * c + lane;
      if (i < WIDTH) {
        x[i] = v[c];
      }
    }
  }
  GROUP_BARRIER();
}

// Stages h0, 2 h0, .., 2^(S-1) h0 (h0 >= 32: consecutive threads take consecutive bases,
// so no bank conflict), a thread at a time taking the 2^S elements base + k h0 they mix.
template <int WIDTH, int S, int NT>
KFN void radix_butterflies(GRP float* x, int h0, int lid) {
  const int R = 1 << S;
  for (int g = lid; g < WIDTH / R; g += NT) {
    const int base = ((g & ~(h0 - 1)) << S) | (g & (h0 - 1));
    float v[R];
    UNROLL for (int k = 0; k < R; ++k) {
      v[k] = x[base + k * h0];
    }
    register_butterflies<S>(v);  // h = h0 << t: the partner is in register k + 2^t
    UNROLL for (int k = 0; k < R; ++k) {
      x[base + k * h0] = v[k];
    }
  }
  GROUP_BARRIER();
}

template <int WIDTH, int M, int LOGP, int NT>
KFN void group_hadamard(GRP float* x, const DEV int8_t* table, int lid) {
  if (LOGP > 0) {
    warp_butterflies<WIDTH, LOGP, NT>(x, lid);
    // The stages a chunk does not reach, in passes of three (the last of one or two).
    const int DONE = 5 + WARP_LOGC(LOGP);
    int h0 = 1 << DONE;
    UNROLL for (int left = LOGP - DONE; left > 0; left -= 3) {
      if (left >= 3) {
        radix_butterflies<WIDTH, 3, NT>(x, h0, lid);
        h0 <<= 3;
      } else if (left == 2) {
        radix_butterflies<WIDTH, 2, NT>(x, h0, lid);
      } else {
        radix_butterflies<WIDTH, 1, NT>(x, h0, lid);
      }
    }
  }
  if (M > 1) {
    const int P = 1 << LOGP;
    // One (block, column) per thread: read the M values of the column, write M sums.
    for (int c = lid; c < WIDTH / M; c += NT) {
      const int base = (c >> LOGP) * (M * P) + (c & (P - 1));
      float v[M];
      for (int l = 0; l < M; ++l) {
        v[l] = x[base + l * P];
      }
      for (int i = 0; i < M; ++i) {
        float o = 0.0f;
        for (int l = 0; l < M; ++l) {
          o = FMAF((float)table[i * M + l], v[l], o);
        }
        x[base + i * P] = o;
      }
    }
    GROUP_BARRIER();
  }
}

// ---- building the input vector in group memory -----------------------------------------
//
// Each runs in every thread of the group over a vector of W floats (W / 4 float4s, thread
// lid taking float4s lid, lid + NT, ...: coalesced 16-byte reads of device memory) and
// ends with the group memory it wrote complete for every thread.

// sum + the squares of v's four elements (one fixed order).
KFN float sumsq4(float4 v, float sum) {
  return FMAF(v.x, v.x, FMAF(v.y, v.y, FMAF(v.z, v.z, FMAF(v.w, v.w, sum))));
}

// v * inv * n, elementwise: one float4 of rms_norm(h) * norm_weight.
KFN float4 norm4(float4 v, float inv, float4 n) {
  float4 y;
  y.x = v.x * inv * n.x;
  y.y = v.y * inv * n.y;
  y.z = v.z * inv * n.z;
  y.w = v.w * inv * n.w;
  return y;
}

// 1 / rms(h) = rsqrt(sum(h^2) / W + eps), eps = params[0], the same bits in every thread
// (group_sum's fixed order). With STAGE, h is also copied into xs4 on the way (group_sum's
// barriers publish it), so that rms_prologue scales it in place instead of reading h
// again. eps is read after the reduction (passing its value would load it before).
template <int W, int NT, bool STAGE>
KFN float rms_inv(GRP float4* xs4, GRP float* red, const DEV float4* h4, const DEV float* params, int lid, int lane,
                  int warp) {
  float ss = 0.0f;
  UNROLL for (int it = 0; it < (W / 4 + NT - 1) / NT; ++it) {
    const int i4 = lid + it * NT;
    if (i4 < W / 4) {
      const float4 v = h4[i4];
      if (STAGE) {
        xs4[i4] = v;
      }
      ss = sumsq4(v, ss);
    }
  }
  ss = group_sum<NT>(ss, red, lane, warp);
  return RSQRTF(ss / (float)W + params[0]);
}

// THE RMS PROLOGUE: xs4 <- rms_norm(h) * nw (h staged in group memory, then scaled in
// place: h is read from device memory once).
template <int W, int NT>
KFN void rms_prologue(GRP float4* xs4, GRP float* red, const DEV float4* h4, const DEV float4* n4,
                      const DEV float* params, int lid, int lane, int warp) {
  const float inv = rms_inv<W, NT, true>(xs4, red, h4, params, lid, lane, warp);
  UNROLL for (int it = 0; it < (W / 4 + NT - 1) / NT; ++it) {
    const int i4 = lid + it * NT;
    if (i4 < W / 4) {
      const float4 v = xs4[i4];
      const float4 n = n4[i4];
      xs4[i4] = norm4(v, inv, n);
    }
  }
  GROUP_BARRIER();
}

// What scatter_signed reads, a float4 at a time: a vector in device memory as it is
// (DevVec), or rms_norm(h) * n computed on the way (RmsNormed, h read a second time: a
// scatter cannot scale in place).
struct DevVec {
  const DEV float4* x;
  KFN DevVec(const DEV float4* x_) : x(x_) {}
  KFN float4 at(int i4) const { return x[i4]; }
};
struct RmsNormed {
  const DEV float4* h;
  const DEV float4* n;
  float inv;
  KFN RmsNormed(const DEV float4* h_, const DEV float4* n_, float inv_) : h(h_), n(n_), inv(inv_) {}
  KFN float4 at(int i4) const {
    const float4 v = h[i4];
    const float4 w = n[i4];
    return norm4(v, inv, w);
  }
};

// THE SIGNED SCATTER: with ROT, (P D v)[dest[p]] = signs[p] * v[p] written into group
// memory, sdest[p] = 2 dest[p] + (signs[p] < 0) (dest the inverse permutation, the sign
// in the low bit: one index array read, coalesced, where gathering v[perm[i]] made each
// element two dependent round trips); without ROT, xs4 = v.
template <int W, int NT, bool ROT, typename SRC>
KFN void scatter_signed(GRP float4* xs4, SRC src, const DEV int4* d4, int lid) {
  GRP float* xs = (GRP float*)xs4;
  UNROLL for (int it = 0; it < (W / 4 + NT - 1) / NT; ++it) {
    const int i4 = lid + it * NT;
    if (i4 < W / 4) {
      const float4 v = src.at(i4);
      if (ROT) {
        const int4 d = d4[i4];
        xs[d.x >> 1] = (d.x & 1) ? -v.x : v.x;
        xs[d.y >> 1] = (d.y & 1) ? -v.y : v.y;
        xs[d.z >> 1] = (d.z & 1) ? -v.z : v.z;
        xs[d.w >> 1] = (d.w & 1) ? -v.w : v.w;
      } else {
        xs4[i4] = v;
      }
    }
  }
  GROUP_BARRIER();
}
