// The Metal prelude: the ONLY Metal-specific text of the tail's kernels.
//
// Everything above the "//== body ==" line goes into the kernel's header (before
// MLX's generated `[[kernel]]` signature); everything below it is prepended to each
// kernel body. MLX passes a thread-position attribute to the kernel only when its
// name appears in the body, which is why the indices are read here, in the body part.
// common.h and the *.body files use only the names defined here and their CUDA twins
// in prelude_cuda.h.

// A helper function callable from a kernel.
#define KFN inline
// Address spaces of device (global) memory and group (threadgroup) memory.
#define DEV device
#define GRP threadgroup
// A reference or pointer to a thread's own variables (a helper updating a caller's
// registers): Metal wants their address space named.
#define THR thread
// Declaring group memory inside a kernel body.
#define GROUP_SHARED threadgroup
// Every thread of the group waits here; group-memory writes before it are visible after.
#define GROUP_BARRIER() metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup)
// Loop unrolling is left to the Metal compiler.
#define UNROLL
// Reinterpret 32 bits as a float (as_type is unqualified in MSL).
#define BITS_F32(u) as_type<float>(u)
// A float's 32 bits.
#define F32_BITS(f) as_type<uint>(f)
// A plain 16-byte weight load.
#define LOAD_STREAM(p) (*(p))
// A uint4 from four words.
#define UINT4(a, b, c, d) uint4((a), (b), (c), (d))
#define EXPF(x) metal::exp(x)
#define LOGF(x) metal::log(x)
#define RSQRTF(x) metal::rsqrt(x)
#define FMAF(a, b, c) metal::fma((a), (b), (c))

typedef uint u32;
typedef ushort u16;
typedef uchar u8;

// p[K], K a constant (CUDA's twin puts K into its load instruction).
template <int K>
KFN u32 load_stream_at(const DEV u32* p) { return p[K]; }
#define LOAD_STREAM_AT(p, K) load_stream_at<K>(p)

// The IEEE halves in v's low and high 16 bits, as floats (exact).
KFN float half_lo(u32 v) { return float(as_type<half2>(v).x); }
KFN float half_hi(u32 v) { return float(as_type<half2>(v).y); }

// (v & m) | e (CUDA's twin is one LOP3 instruction).
KFN u32 and_or(u32 v, u32 m, u32 e) { return (v & m) | e; }

// The sum of v over the 32 lanes of a SIMD-group, in every lane.
KFN float warp_sum(float v) {
  return metal::simd_sum(v);
}

// v from the lane whose index is this lane's XOR m (every lane of the SIMD-group must call it).
KFN float lane_xor(float v, int m) {
  return metal::simd_shuffle_xor(v, (ushort)m);
}

//== body ==
  // Thread and group indices (1-D launches), the names the bodies use.
  const int lid = (int)thread_position_in_threadgroup.x;   // thread in its group
  const int gid = (int)threadgroup_position_in_grid.x;     // group in the grid
  const int ngroups = (int)threadgroups_per_grid.x;        // groups in the grid
  const int lane = (int)thread_index_in_simdgroup;         // lane in its SIMD-group (32 wide)
  const int warp = (int)simdgroup_index_in_threadgroup;    // SIMD-group in its group
