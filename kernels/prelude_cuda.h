// The CUDA prelude: the ONLY CUDA-specific text of the tail's kernels.
//
// Everything above the "//== body ==" line goes into the kernel's header (before
// MLX's generated `__global__` signature); everything below it is prepended to each
// kernel body. common.h and the *.body files use only the names defined here and
// their Metal twins in prelude_metal.h.

#include <cuda_bf16.h>

// A helper function callable from a kernel.
#define KFN __device__ __forceinline__
// Address spaces: device (global) memory and group (shared) memory need no
// qualifier in CUDA; Metal needs `device` / `threadgroup`.
#define DEV
#define GRP
// A reference or pointer to a thread's own variables (Metal names their address space).
#define THR
// Declaring group memory inside a kernel body.
#define GROUP_SHARED __shared__
// Every thread of the group waits here; group-memory writes before it are visible after.
#define GROUP_BARRIER() __syncthreads()
// Unroll the loop that follows (the load batches must live in registers).
#define UNROLL _Pragma("unroll")
// Reinterpret 32 bits as a float.
#define BITS_F32(u) __uint_as_float(u)
// A float's 32 bits.
#define F32_BITS(f) __float_as_uint(f)
// A 16-byte weight load that streams past the caches (weights are read once a tail).
#define LOAD_STREAM(p) __ldcs(p)
// A uint4 from four words.
#define UINT4(a, b, c, d) make_uint4((a), (b), (c), (d))
#define EXPF(x) expf(x)
#define LOGF(x) logf(x)
#define RSQRTF(x) rsqrtf(x)
#define FMAF(a, b, c) fmaf((a), (b), (c))

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

// p[K] for a u32 pointer p and a constant K, streamed as LOAD_STREAM, with K in the
// instruction ([p + 4K]). Through LOAD_STREAM(p + K), the compiler's loop strength
// reduction gave each of a quantized unit's four loads a 64-bit pointer of its own, then
// rebuilt those pointers every batch (kernels/README.md, "Address arithmetic").
template <int K>
KFN u32 load_stream_at(const u32* p) {
  u32 v;
  asm("ld.global.cs.u32 %0, [%1+%2];" : "=r"(v) : "l"(p), "n"(4 * K));
  return v;
}
#define LOAD_STREAM_AT(p, K) load_stream_at<K>(p)

// (v & m) | e in one LOP3. Written as C, nvcc spends two (one an immediate each: a LOP3
// takes one), so e goes in as a register operand.
KFN u32 and_or(u32 v, u32 m, u32 e) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(v), "r"(m), "r"(e));
  return r;
}

// The IEEE halves in v's low and high 16 bits, as floats (exact: one HADD2.F32 each, on
// the FMA pipe, where the 4-bit codes' other work is on the ALU pipe).
KFN float half_lo(u32 v) {
  float f;
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, l; }" : "=f"(f) : "r"(v));
  return f;
}
KFN float half_hi(u32 v) {
  float f;
  asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; cvt.f32.f16 %0, h; }" : "=f"(f) : "r"(v));
  return f;
}

// The sum of v over the 32 lanes of a warp, in every lane.
KFN float warp_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 16);
  v += __shfl_xor_sync(0xffffffffu, v, 8);
  v += __shfl_xor_sync(0xffffffffu, v, 4);
  v += __shfl_xor_sync(0xffffffffu, v, 2);
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v;
}

// v from the lane whose index is this lane's XOR m (every lane of the warp must call it).
KFN float lane_xor(float v, int m) { return __shfl_xor_sync(0xffffffffu, v, m); }


// -- one launch, several phases (CUDA only: kernels/tail_one_launch.body) -------------
// Metal has no counterpart: it promises no forward progress between threadgroups, so a
// group spinning on a counter may wait forever for a group that never starts.

// The GPU's global timer, in nanoseconds.
KFN unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// *p, read with acquire semantics at GPU scope: what other groups wrote before their
// release (the atomicAdd after __threadfence in grid_barrier) is visible after it.
KFN u32 load_acquire(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every group of the grid waits here until `target` arrivals have been counted in
// *count (the n-th barrier of a launch of G groups waits for n G): one thread a group
// publishes its group's writes (__threadfence), arrives (atomicAdd) and polls the counter;
// the group's other threads wait at the group barrier. Safe only while every group of the
// grid is resident at once (tail_one_launch launches one group an SM, which always fits).
// A wait longer than limit_ns returns false instead of hanging: the caller poisons its
// outputs and raises a flag, so a grid that was not resident shows as NaN, never as a hang
// or as plausible numbers.
KFN bool grid_barrier(u32* count, u32 target, unsigned long long limit_ns, int lid) {
  __shared__ int arrived_in_time;
  __syncthreads();  // the group's writes are done
  if (lid == 0) {
    __threadfence();  // ... and visible at GPU scope before this group is counted
    atomicAdd(count, 1u);
    const unsigned long long t0 = global_ns();
    int ok = 1;
    while (load_acquire(count) < target) {
      if (global_ns() - t0 > limit_ns) {
        ok = 0;
        break;
      }
    }
    arrived_in_time = ok;
  }
  __syncthreads();  // the group's threads read after every group's writes
  return arrived_in_time != 0;
}

//== body ==
  // Thread and group indices (1-D launches), the names the bodies use.
  const int lid = (int)threadIdx.x;        // thread in its group
  const int gid = (int)blockIdx.x;         // group in the grid
  const int ngroups = (int)gridDim.x;      // groups in the grid
  const int lane = (int)(threadIdx.x & 31u);  // lane in its warp
  const int warp = (int)(threadIdx.x >> 5);   // warp in its group
