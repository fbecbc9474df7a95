// The row dot fed by asynchronous copies (experiments/async_copy_rowdot.py says how a warp's
// ring of copies runs). MLX's mx.fast.cuda_kernel wraps it in the kernel's signature: inputs
// w, s, b, x; output y; template values K, R, NT, ST.
  constexpr int NG = K / 64;                       // quantization groups a row
  constexpr int NU = K / 32;                       // 16-byte units a row
  constexpr int SPR = K / 1024;                    // warp steps a row
  constexpr int XP = 36;                           // floats a unit's x takes (32 + 4 padding)
  constexpr int WARPS = NT / 32;
  constexpr int SLOTS = 36;                        // 16-byte slots a stage: 32 units, 2 scales, 2 biases
  __shared__ __align__(16) float xs[NU * XP];
  __shared__ float xu[NU];                         // each unit's sum of x
  __shared__ __align__(16) uint4 ring[WARPS * ST * SLOTS];
  const int lid = threadIdx.x, lane = lid & 31, warp = lid >> 5;

  // prologue: x into group memory, padded; each unit's sum of x
  for (int k = lid; k < K; k += NT) xs[(k >> 5) * XP + (k & 31)] = x[k];
  for (int u = lid; u < NU; u += NT) {
    float sum = 0.0f;
    for (int i = 0; i < 32; ++i) sum += x[32 * u + i];
    xu[u] = sum;
  }
  __syncthreads();

  const int gw = blockIdx.x * WARPS + warp, nw = gridDim.x * WARPS;
  const int steps = gw < R ? ((R - 1 - gw) / nw + 1) * SPR : 0;   // this warp's steps
  uint4* my_ring = ring + warp * ST * SLOTS;
  CopyStream<SPR, SLOTS, ST> copies;
  copies.w = reinterpret_cast<const uint4*>(w) + (size_t)gw * NU;
  copies.s = reinterpret_cast<const unsigned short*>(s) + (size_t)gw * NG;
  copies.b = reinterpret_cast<const unsigned short*>(b) + (size_t)gw * NG;
  copies.w_next_row = (size_t)nw * NU;
  copies.sb_next_row = (size_t)nw * NG;
  copies.left = steps;

  for (int j = 0; j < ST - 1; ++j) copies.issue(my_ring, lane);  // the ring's first ST - 1 steps
  int slot = 0;                                                   // the slot step j is read from: j % ST
  for (int row = gw; row < R; row += nw) {
    float acc = 0.0f;
    #pragma unroll
    for (int st = 0; st < SPR; ++st) {
      copies.issue(my_ring, lane);                 // step j + ST - 1
      cp_async_wait<ST - 1>();                     // this lane's copies of step j have landed
      __syncwarp();                                // and every lane's (the scales, the biases)
      const uint4* here = my_ring + slot * SLOTS;
      const int unit = st * 32 + lane;
      const uint4 q = here[lane];
      const unsigned short* sb = reinterpret_cast<const unsigned short*>(here + 32);
      const float4* xv = reinterpret_cast<const float4*>(xs + unit * XP);
      float d = word_dot(q.x, xv[0], xv[1], 0.0f);
      d = word_dot(q.y, xv[2], xv[3], d);
      d = word_dot(q.z, xv[4], xv[5], d);
      d = word_dot(q.w, xv[6], xv[7], d);
      acc = fmaf(bf16_float(sb[lane >> 1]), d, fmaf(bf16_float(sb[16 + (lane >> 1)]), xu[unit], acc));
      __syncwarp();                                // every lane done with the slot before it is refilled
      slot = slot == ST - 1 ? 0 : slot + 1;
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
    if (lane == 0) y[row] = acc;
  }
