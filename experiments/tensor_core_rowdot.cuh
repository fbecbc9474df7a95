// Helpers the tensor-core row dot's body (tensor_core_rowdot.cu) calls; MLX puts this text
// before the kernel.
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
