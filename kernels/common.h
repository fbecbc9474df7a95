// The tail kernels' shared helpers, written once for both dialects.
//
// Only the prelude's names are used here (KFN, DEV, GRP, GROUP_BARRIER, BITS_F32,
// FMAF, RSQRTF, warp_sum, u32, u16), so the same text compiles as Metal and as CUDA.
// Helpers take values or explicitly qualified pointers (Metal pointers carry an
// address space), and the x-dependent dot products are macros indexing whatever
// float4 array the caller names: group memory in wo / gate-up / QKV, device memory
// in down, whose 17408-long input does not fit 32 KB of Metal threadgroup memory.

// Weight formats (template value FMT). A "unit" is the 16 bytes one thread loads at a
// time: 4 float32 weights, 8 bfloat16 weights, or 32 4-bit weights (MLX's affine
// layout: uint32 words along the row, low nibble first; scales and biases per group;
// see Q4_WORD for which words a unit holds).
#define WF_F32 0
#define WF_BF16 1
#define WF_Q4 2

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

// 4-bit codes, two at a time: the nibbles n and n + 4 of v become the bfloat16 pair
// (1 + q/16) in one word (the code in the top four mantissa bits, exactly), so a shift
// and a mask make two values that bf16_lo / bf16_hi then widen. The "1 +" is taken out
// again per word with the sum of x: sum (q/16) x = sum (1 + q/16) x - sum x.
#define Q4_MASK 0x00780078u
#define Q4_ONE 0x3F803F80u

// acc + sum over the 8 codes of v of (1 + q/16) * x, x = (a, b) in element order.
KFN float dot_q4x8(u32 v, float4 a, float4 b, float acc) {
  const u32 p0 = ((v << 3) & Q4_MASK) | Q4_ONE;  // elements 0 and 4
  const u32 p1 = ((v >> 1) & Q4_MASK) | Q4_ONE;  // 1 and 5
  const u32 p2 = ((v >> 5) & Q4_MASK) | Q4_ONE;  // 2 and 6
  const u32 p3 = ((v >> 9) & Q4_MASK) | Q4_ONE;  // 3 and 7
  acc = FMAF(bf16_lo(p0), a.x, acc);
  acc = FMAF(bf16_hi(p0), b.x, acc);
  acc = FMAF(bf16_lo(p1), a.y, acc);
  acc = FMAF(bf16_hi(p1), b.y, acc);
  acc = FMAF(bf16_lo(p2), a.z, acc);
  acc = FMAF(bf16_hi(p2), b.z, acc);
  acc = FMAF(bf16_lo(p3), a.w, acc);
  acc = FMAF(bf16_hi(p3), b.w, acc);
  return acc;
}

KFN float sum8(float4 a, float4 b) { return ((a.x + a.y) + (a.z + a.w)) + ((b.x + b.y) + (b.z + b.w)); }

// Weight elements per unit.
#define UNIT_ELEMS(FMT) ((FMT) == WF_F32 ? 4 : ((FMT) == WF_BF16 ? 8 : 32))

// A quantized scale or bias (SFMT 0: float32, 1: bfloat16) at index i, from the two
// views P16 / P32 of the same buffer.
#define LOAD_SB(SFMT, P16, P32, i) ((SFMT) == 1 ? BITS_F32(((u32)((P16)[i])) << 16) : (P32)[(i)])

// Which uint32 word of a 4-bit row holds the k-th word of unit u. Contiguous (QI false):
// 4u + k. Interleaved (QI true, rows of a multiple of 128 words): the 32 lanes that load
// units 32c .. 32c + 31 together read words 128c + lane + 32k, so each of the four loads
// is one contiguous 128-byte line per warp and each lane's x (8 floats a word) sits 32
// bytes from its neighbour's -- not 128, which made every x read an 8-way conflict.
#define Q4_WORD(QI, u, k) ((QI) ? ((((u) >> 5) << 7) + ((u) & 31) + 32 * (k)) : (4 * (u) + (k)))

// Unit u of the row at WR (a const DEV uint4*): its 16 bytes, or for interleaved 4-bit
// rows its four words gathered.
#define LOAD_UNIT(FMT, QI, WR, u)                                                        \
  (((FMT) == WF_Q4 && (QI))                                                              \
       ? UINT4(LOAD_STREAM((const DEV u32*)(WR) + Q4_WORD(true, (u), 0)),                \
               LOAD_STREAM((const DEV u32*)(WR) + Q4_WORD(true, (u), 1)),                \
               LOAD_STREAM((const DEV u32*)(WR) + Q4_WORD(true, (u), 2)),                \
               LOAD_STREAM((const DEV u32*)(WR) + Q4_WORD(true, (u), 3)))                \
       : LOAD_STREAM((WR) + (u)))

// One 4-bit word (8 codes, elements 8 wi ..) into acc: scale * (q . x) + bias * sum(x).
#define Q4_WORD_DOT(SFMT, GS, V, X4, wi, acc, S16, S32, B16, B32)                        \
  do {                                                                                  \
    const float4 xa_ = X4[2 * (wi)], xb_ = X4[2 * (wi) + 1];                             \
    const float sx_ = sum8(xa_, xb_);                                                   \
    const float d_ = dot_q4x8((V), xa_, xb_, 0.0f) - sx_;  /* sum (q/16) x */            \
    const int g_ = (8 * (wi)) / (GS);                                                   \
    acc = FMAF(16.0f * LOAD_SB(SFMT, S16, S32, g_), d_, FMAF(LOAD_SB(SFMT, B16, B32, g_), sx_, acc)); \
  } while (0)

// acc += unit u of one weight row (its 16 bytes already loaded into WV) . x, where X4
// indexes x as float4 (group or device memory). For 4-bit weights: S16/S32 and B16/B32
// are the row's scales and biases (one per GS elements): w = scale * q + bias.
#define UNIT_DOT(FMT, SFMT, GS, QI, WV, X4, u, acc, S16, S32, B16, B32)                  \
  do {                                                                                  \
    if ((FMT) == WF_BF16) {                                                             \
      acc = dot_bf16x8((WV), X4[2 * (u)], X4[2 * (u) + 1], acc);                        \
    } else if ((FMT) == WF_F32) {                                                       \
      acc = dot_f32x4((WV), X4[(u)], acc);                                              \
    } else {                                                                            \
      Q4_WORD_DOT(SFMT, GS, (WV).x, X4, Q4_WORD(QI, (u), 0), acc, S16, S32, B16, B32);  \
      Q4_WORD_DOT(SFMT, GS, (WV).y, X4, Q4_WORD(QI, (u), 1), acc, S16, S32, B16, B32);  \
      Q4_WORD_DOT(SFMT, GS, (WV).z, X4, Q4_WORD(QI, (u), 2), acc, S16, S32, B16, B32);  \
      Q4_WORD_DOT(SFMT, GS, (WV).w, X4, Q4_WORD(QI, (u), 3), acc, S16, S32, B16, B32);  \
    }                                                                                   \
  } while (0)

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

// x <- blockdiag(H_b) x in group memory, unnormalised (the caller scales by
// 1/sqrt(b)), for b = M * 2^LOGP: H_b = kron(H_M, H_{2^LOGP}) applied as y = H_b x
// (MLX's mx.hadamard_transform). Viewing each block as an M x 2^LOGP row-major array X,
// that is H_M X H_{2^LOGP}: a Walsh-Hadamard butterfly along the rows, then the M x M
// table (row-major +-1, `table`) mixing the rows. Every thread of the group calls this.
template <int WIDTH, int M, int LOGP, int NT>
KFN void group_hadamard(GRP float* x, const DEV int8_t* table, int lid) {
  const int P = 1 << LOGP;
  for (int h = 1; h < P; h <<= 1) {
    for (int j = lid; j < WIDTH / 2; j += NT) {
      const int i = ((j & ~(h - 1)) << 1) | (j & (h - 1));
      const float a = x[i];
      const float b = x[i + h];
      x[i] = a + b;
      x[i + h] = a - b;
    }
    GROUP_BARRIER();
  }
  if (M > 1) {
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
