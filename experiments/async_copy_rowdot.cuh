// Helpers the asynchronous-copy row dot's body (async_copy_rowdot.cu) calls; MLX puts this
// text before the kernel.
// 16 bytes from device memory to group memory, asynchronously (no register holds them)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }

__device__ __forceinline__ float bf16_float(unsigned short v) {
  return __uint_as_float(((unsigned)v) << 16);
}

// code n of a word as a float, exactly: 0x4B000000 | q is 2^23 + q. The mask-and-or is ONE
// LOP3 with the exponent in a register (written as C, ptxas spends two: a LOP3 takes one
// immediate), as kernels/prelude_cuda.h's and_or does
__device__ __forceinline__ float code(unsigned v, int n) {
  unsigned biased;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(biased) : "r"(v >> (4 * n)), "n"(15), "r"(0x4B000000u));
  return __uint_as_float(biased) - 8388608.0f;
}

// d + the dot of a word's 8 codes with their x (lo: codes 0-3, hi: codes 4-7)
__device__ __forceinline__ float word_dot(unsigned v, float4 lo, float4 hi, float d) {
  d = fmaf(code(v, 0), lo.x, d); d = fmaf(code(v, 1), lo.y, d);
  d = fmaf(code(v, 2), lo.z, d); d = fmaf(code(v, 3), lo.w, d);
  d = fmaf(code(v, 4), hi.x, d); d = fmaf(code(v, 5), hi.y, d);
  d = fmaf(code(v, 6), hi.z, d); d = fmaf(code(v, 7), hi.w, d);
  return d;
}

// A warp's copies, one step (32 units, 16 scales, 16 biases) at a time, in the order the
// warp reads them: its rows gw, gw + nw, ..., K / 1024 steps a row. issue() copies the next
// step into the next ring slot (every lane its unit, lanes 0-1 the step's scales, 2-3 its
// biases) and commits it as one copy group; past the warp's last step it commits an empty
// group, so that cp.async.wait_group's count means the same at every step.
template <int SPR, int SLOTS, int ST>
struct CopyStream {
  const uint4* w;                                  // the next step's row: its units,
  const unsigned short* s;                         // its scales
  const unsigned short* b;                         // and its biases
  size_t w_next_row, sb_next_row;                  // from a row to the warp's next row
  int st = 0, slot = 0, left = 0;                  // the next step's place in its row, its slot, steps left

  __device__ __forceinline__ void issue(uint4* ring, int lane) {
    if (left > 0) {
      uint4* dst = ring + slot * SLOTS;
      cp_async16(dst + lane, w + st * 32 + lane);
      if (lane < 4) cp_async16(dst + 32 + lane, (lane < 2 ? s : b) + st * 16 + (lane & 1) * 8);
      if (++st == SPR) {
        st = 0;
        w += w_next_row;
        s += sb_next_row;
        b += sb_next_row;
      }
      --left;
    }
    slot = slot == ST - 1 ? 0 : slot + 1;
    cp_async_commit();
  }
};
