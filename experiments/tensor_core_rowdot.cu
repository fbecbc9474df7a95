// The tensor-core row dot's body (experiments/tensor_core_rowdot.py says how it maps a 4-bit row
// onto mma.sync). MLX's mx.fast.cuda_kernel wraps it in the kernel's signature: inputs w, s, b, x;
// output y; template values K, R, NT, UG, SUB.
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
