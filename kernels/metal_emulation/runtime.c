// The emulator: one launch of a compiled Metal kernel on the CPU, every GPU thread a
// fiber (its own stack; switched by fiber_switch on x86-64, _setjmp/_longjmp elsewhere),
// threadgroups one after another.
//
// What it models (kernels/README.md, "Metal on the CPU"):
// - barriers: a group is released only when EVERY thread of it waits at the SAME
//   threadgroup_barrier call (its line and column in the generated source); threads at
//   different barriers, or some finished while others wait, is a divergent barrier;
// - SIMD-groups of 32 lanes (lane = thread % 32): simd_sum and the shuffles release a
//   SIMD-group when none of its lanes can run on and every lane that waits at an operation
//   waits at the same call; those lanes are the active set, as Metal defines it (the others
//   finished, or wait at a threadgroup barrier: they took another path). simd_sum and
//   simd_max combine the active lanes in one fixed order; a shuffle or broadcast that reads
//   an inactive lane (undefined in Metal) is an error. Lanes waiting at two different
//   operations are an error too: which one an Apple GPU runs first depends on where its
//   compiler reconverges the paths, which the emulator does not know;
// - threadgroup memory: fresh for every group, every byte 0xFF (a NaN in any float),
//   at most the launch's limit a group (32,768 bytes on Apple GPUs), each array ending at
//   a guard page;
// - device buffers are allocated by the caller with metal_emulation_buffer (ending at a
//   guard page, outputs NaN-filled), and kept from launch to launch, refilled so that a
//   reused buffer is byte for byte a fresh one (metal_emulation.py);
// - the schedule: which thread runs next between synchronisations, and the order of the
//   groups. Three schedules keep the SIMD-groups of a group in step (every runnable thread
//   runs to its next synchronisation, in ascending, descending or shuffled thread order,
//   then every SIMD-group whose lanes all arrived is released); three let them run apart,
//   as on an Apple GPU, where SIMD-groups are independent between threadgroup barriers:
//   one SIMD-group runs as far as it can (to a threadgroup barrier, or to its end) before
//   the next starts, in ascending or descending SIMD-group order, or a seeded random
//   thread runs to its next synchronisation at every step. A result that depends on the
//   schedule is a race (a missing barrier);
// - 1-, 2- and 3-D launches as Metal's dispatchThreads defines them: the grid counts
//   threads; in every dimension a grid that is not a multiple of the threadgroup ends in
//   partial groups (threads_per_threadgroup is the group's own size there); a thread's
//   index in its group is x + y X + z X Y (X, Y its group's size), and SIMD-groups are 32
//   consecutive indices.
// - math (metal_emulation_math): exp, exp2 and rsqrt in the launch's math mode: the host's
//   result, or Metal's precise or fast contract (MSL spec 8.4) with the correctly rounded
//   result moved to the edge of the function's bound, or to a seeded random point in it.
// A fault (a guard page, a fiber's stack overflow) is caught and reported, not a crash.
#define _GNU_SOURCE
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SIMD_WIDTH 32
// On x86-64 a fiber switch is a few instructions of inline assembly (fiber_switch below);
// elsewhere it is _setjmp/_longjmp, and a fiber starts with makecontext/setcontext.
#if defined(__x86_64__)
#define FIBER_SWITCH_ASM 1
#else
#define FIBER_SWITCH_ASM 0
#endif
#define MAX_ARRAYS 16
#define STACK_BYTES (256 * 1024)
#define MAX_THREADS 1024

enum { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };
// Schedules (metal_emulation.SCHEDULES, in this order).
enum { LOCKSTEP_ASCENDING = 0, LOCKSTEP_DESCENDING = 1, LOCKSTEP_SHUFFLED = 2, APART_ASCENDING = 3,
       APART_DESCENDING = 4, APART_RANDOM = 5 };

typedef struct {
  unsigned tpitg[3], tgpig[3], tpg[3];  // thread_position_in_threadgroup, threadgroup_position_in_grid, threadgroups_per_grid
  unsigned simd_lane, simd_group, threads_per_tg[3];
  unsigned tpig[3];  // thread_position_in_grid: group x the DISPATCHED group size + position in the group
  unsigned tpgrid[3];  // threads_per_grid (the grid in threads, as dispatchThreads takes it)
  unsigned tindex, nsimd;  // thread_index_in_threadgroup (x + y X + z X Y, X Y this group's size); simdgroups_per_threadgroup
  unsigned dtptg[3];  // dispatch_threads_per_threadgroup: the dispatched group size (a partial group's is smaller)
} metal_emulation_ids;

typedef void (*entry_fn)(void* const* buffers, const metal_emulation_ids* ids);

typedef struct {
#if FIBER_SWITCH_ASM
  void* sp;         // where the fiber resumes: its saved stack pointer (fiber_switch)
#else
  ucontext_t ctx;   // the fiber's start (makecontext); switches after that are _setjmp/_longjmp
  jmp_buf jump;     // where the fiber resumes
#endif
  int started;
  int state, line, column, op, arg, next_array;
  float value, result;
  metal_emulation_ids* ids;  // E.ids[t], kept apart: a fiber's scheduling state is one cache line
} __attribute__((aligned(64))) fiber;

typedef struct {
  char* base;      // the mapping: data pages then one guard page
  size_t mapped;   // bytes mapped
  char* data;      // the array: it ends where the guard page starts
  size_t bytes;
  const char* declared;  // the name as the declaring thread passed it (a string literal of the kernel's)
  char name[64];
} tg_array;

static struct {
  fiber* fibers;
  metal_emulation_ids* ids;  // every thread's ids (fiber.ids points into it)
  char* stacks;
  int nthreads, max_threads, current;  // threads of the running group; of a full group
#if FIBER_SWITCH_ASM
  void* scheduler;   // the scheduler's saved stack pointer while a fiber runs
#else
  jmp_buf scheduler;
  ucontext_t blank;  // one getcontext, copied for every fiber's start
#endif
  entry_fn entry;
  void* const* buffers;
  tg_array arrays[MAX_ARRAYS];
  int narrays;
  size_t tg_bytes, tg_limit;
  unsigned long long rng;  // the random schedule's state
  char* error;
  size_t error_cap;
  sigjmp_buf fault_jump;
  volatile void* fault_addr;
  int in_launch;
  unsigned group;  // the running group's linear index (x + y X + z X Y over the grid's groups)
  unsigned grid[3], tg[3], ngroups[3];  // the launch: threads a dimension, the dispatched group, groups
} E;

// Asked of the system once: the stacks' and arrays' arithmetic asks for it at every launch.
static size_t page_size(void) {
  static size_t ps;
  if (ps == 0) ps = (size_t)sysconf(_SC_PAGESIZE);
  return ps;
}

static int fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static int fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(E.error, E.error_cap, fmt, ap);
  va_end(ap);
  return 1;
}

// ---- math modes -------------------------------------------------------------------------------

enum { MATH_HOST = 0, MATH_PRECISE = 1, MATH_FAST = 2 };
enum { ERROR_EDGE_HIGH = 0, ERROR_EDGE_LOW = 1, ERROR_RANDOM = 2 };
enum { FN_EXP = 0, FN_EXP2 = 1, FN_RSQRT = 2 };
static struct {
  int mode, error;
  unsigned long long seed;
} M;

// The math mode of the launches that follow (metal_emulation.MATH_MODES, .MATH_ERRORS).
void metal_emulation_set_math(int mode, int error, unsigned long seed) {
  M.mode = mode;
  M.error = error;
  M.seed = seed;
}

// Metal's bound, in ulps, for fn at x (MSL spec 8.4): fast exp and exp2 3 + floor(|2x|),
// fast rsqrt 2; precise exp and exp2 4, precise rsqrt correctly rounded (0).
static double ulp_bound(int fn, int mode, float x) {
  if (fn == FN_RSQRT) return mode == MATH_FAST ? 2.0 : 0.0;
  return mode == MATH_FAST ? 3.0 + floor(fabs(2.0 * (double)x)) : 4.0;
}

static unsigned long long mix64(unsigned long long z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static int subnormal(float v) { return v != 0.0f && fabsf(v) < 1.17549435e-38f; }

// fn's result at x in `mode` (-1: the launch's). The error is a function of x alone (never
// of which thread asks, or when), so it cannot make schedules disagree.
float metal_emulation_math(int fn, int mode, float x, float host) {
  if (mode < 0) mode = M.mode;
  if (mode == MATH_HOST) return host;
  if (mode == MATH_FAST && subnormal(x)) x = copysignf(0.0f, x);
  const double d = fn == FN_EXP ? exp((double)x) : fn == FN_EXP2 ? exp2((double)x) : 1.0 / sqrt((double)x);
  float r = (float)d;  // correctly rounded (a double's 53 bits leave no double-rounding case that matters here)
  const double bound = ulp_bound(fn, mode, x);
  if (bound > 0.0 && isfinite(r) && r > 0.0f && isfinite(d)) {
    long long k = (long long)bound;
    if (M.error == ERROR_EDGE_LOW) {
      k = -k;
    } else if (M.error == ERROR_RANDOM) {
      uint32_t xb;
      memcpy(&xb, &x, sizeof xb);
      unsigned long long h = mix64(M.seed * 0x9e3779b97f4a7c15ull ^ ((unsigned long long)fn << 32) ^ xb);
      k = (long long)(h % (unsigned long long)(2 * k + 1)) - k;
    }
    // Step k floats from r (results are positive: the bits order like the values), then
    // back one if that lands beyond the bound from the true value d (r itself is within
    // half an ulp of d, so r + k ulps can be k + 1/2 away).
    const double ulp = ldexp(1.0, ilogb(d) - 23);
    int32_t rb;
    memcpy(&rb, &r, sizeof rb);
    for (long long step = k; step != 0; step += step > 0 ? -1 : 1) {
      int32_t cb = rb + (int32_t)step;
      if (cb <= 0 || cb >= 0x7F800000) continue;
      float c;
      memcpy(&c, &cb, sizeof c);
      if (fabs((double)c - d) <= bound * ulp) {
        r = c;
        break;
      }
    }
  }
  if (mode == MATH_FAST && subnormal(r)) r = copysignf(0.0f, r);
  return r;
}

// ---- half precision ---------------------------------------------------------------------------

// float <-> IEEE binary16 bits, for clang's __fp16 (the stand-in header's half) on targets
// without half conversions in hardware: rounded to nearest even, overflow to infinity,
// gradual underflow to the subnormals; NaN stays NaN (quiet).
unsigned short __gnu_f2h_ieee(float f) {
  uint32_t b;
  memcpy(&b, &f, sizeof b);
  const uint32_t sign = (b >> 16) & 0x8000u, e = (b >> 23) & 0xFFu;
  uint32_t m = b & 0x7FFFFFu;
  if (e == 0xFFu) return (unsigned short)(sign | 0x7C00u | (m ? 0x200u : 0u));
  const int E = (int)e - 112;  // the exponent rebiased 127 -> 15
  if (E >= 31) return (unsigned short)(sign | 0x7C00u);
  if (E <= 0) {  // a half subnormal (or zero): h x 2^-24
    if (E < -10) return (unsigned short)sign;
    m |= 0x800000u;
    const int shift = 14 - E;
    uint32_t h = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (h & 1u))) ++h;
    return (unsigned short)(sign | h);
  }
  uint32_t h = ((uint32_t)E << 10) | (m >> 13);
  const uint32_t rem = m & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry into the exponent rounds up correctly
  return (unsigned short)(sign | h);
}

float __gnu_h2f_ieee(unsigned short h) {
  const uint32_t e = (h >> 10) & 31u, m = h & 1023u;
  float mag;
  if (e == 0) {
    mag = (float)m * 0x1p-24f;  // zero and the subnormals, exactly
  } else if (e == 31) {
    mag = m ? __builtin_nanf("") : __builtin_inff();
  } else {
    const uint32_t b = ((e + 112u) << 23) | (m << 13);
    memcpy(&mag, &b, sizeof mag);
  }
  return (h & 0x8000u) ? -mag : mag;
}

// ---- device buffers ---------------------------------------------------------------------

// `bytes` bytes ending exactly at a PROT_NONE page (reading or writing one element past
// the end faults), every byte `fill`. Freed with metal_emulation_buffer_free.
void* metal_emulation_buffer(size_t bytes, int fill) {
  size_t ps = page_size();
  size_t data_pages = (bytes + ps - 1) / ps;
  if (data_pages == 0) data_pages = 1;
  size_t mapped = (data_pages + 1) * ps;
  char* base = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return NULL;
  mprotect(base + data_pages * ps, ps, PROT_NONE);
  char* data = base + data_pages * ps - bytes;
  memset(data, fill, bytes);
  return data;
}

void metal_emulation_buffer_free(void* data, size_t bytes) {
  size_t ps = page_size();
  size_t data_pages = (bytes + ps - 1) / ps;
  if (data_pages == 0) data_pages = 1;
  char* end = (char*)data + bytes;  // the guard page's start
  munmap(end - data_pages * ps, (data_pages + 1) * ps);
}

// ---- threadgroup memory --------------------------------------------------------------------

// The mappings behind the arrays, kept from group to group and launch to launch: slot k
// is remapped only when the k-th array needs another number of pages (its guard page sits
// right after them). A reused slot is refilled with 0xFF bytes exactly as a fresh one is,
// so reuse changes no result; it saves an mmap, an mprotect and an munmap an array a group.
static struct {
  char* base;
  size_t data_pages;
} tg_pool[MAX_ARRAYS];

// The group's arrays are released (their mappings stay in the pool).
static void free_arrays(void) {
  E.narrays = 0;
  E.tg_bytes = 0;
}

// The k-th threadgroup array a thread declares is the group's k-th array: allocated when
// the first thread of the group declares it, shared by the others. Called where the
// generated source declared `threadgroup T name[N];` (the one rewrite of the source).
void* metal_emulation_threadgroup_alloc(unsigned long bytes, unsigned long align, const char* name) {
  fiber* f = &E.fibers[E.current];
  int k = f->next_array++;
  if (k < E.narrays) {
    // The same literal (every thread runs the same declaration) is the same pointer: the
    // string is compared only when it is not.
    if (E.arrays[k].bytes != bytes || (name != E.arrays[k].declared && strcmp(E.arrays[k].name, name) != 0)) {
      fail("threadgroup array %d is '%s' (%lu bytes) in one thread and '%s' (%zu bytes) in another: "
           "threadgroup declarations must be the same in every thread", k, name, bytes, E.arrays[k].name,
           E.arrays[k].bytes);
      siglongjmp(E.fault_jump, 2);
    }
    return E.arrays[k].data;
  }
  size_t rounded = (bytes + 15) & ~(size_t)15;  // Metal rounds each allocation to 16 bytes
  if (E.tg_bytes + rounded > E.tg_limit || k >= MAX_ARRAYS) {
    fail("threadgroup memory over the limit (threadgroup_memory=%zu bytes; Apple GPUs' limit 32768): '%s' "
         "(%lu bytes) brings the group to %zu bytes, more than %zu", E.tg_limit, name, bytes, E.tg_bytes + rounded,
         E.tg_limit);
    siglongjmp(E.fault_jump, 2);
  }
  size_t ps = page_size();
  size_t data_pages = (bytes + ps - 1) / ps;
  if (data_pages == 0) data_pages = 1;
  tg_array* a = &E.arrays[k];
  a->mapped = (data_pages + 1) * ps;
  if (tg_pool[k].base == NULL || tg_pool[k].data_pages != data_pages) {
    if (tg_pool[k].base) munmap(tg_pool[k].base, (tg_pool[k].data_pages + 1) * ps);
    tg_pool[k].base = mmap(NULL, a->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (tg_pool[k].base == MAP_FAILED) {
      tg_pool[k].base = NULL;
      fail("no memory for threadgroup array '%s' (%lu bytes)", name, bytes);
      siglongjmp(E.fault_jump, 2);
    }
    tg_pool[k].data_pages = data_pages;
    mprotect(tg_pool[k].base + data_pages * ps, ps, PROT_NONE);
  }
  a->base = tg_pool[k].base;
  // The array ends at the guard page (rounded down to its alignment, at most align - 1
  // bytes before it: the kernels' arrays are multiples of 16 bytes, so none).
  uintptr_t end = (uintptr_t)(a->base + data_pages * ps);
  a->data = (char*)((end - bytes) & ~(uintptr_t)(align - 1));
  a->bytes = bytes;
  // Copied by hand: snprintf's frames would take the fiber's stack a page deeper than the
  // kernels go, and every page of depth is zeroed on every stack at every launch.
  size_t len = strlen(name) < sizeof a->name - 1 ? strlen(name) : sizeof a->name - 1;
  memcpy(a->name, name, len);
  a->name[len] = 0;
  a->declared = name;
  memset(a->base, 0xFF, data_pages * ps);  // NaN in every float: a read before a write shows
  E.narrays = k + 1;
  E.tg_bytes += rounded;
  return a->data;
}

// ---- synchronisation --------------------------------------------------------------------------

#if FIBER_SWITCH_ASM
// fiber_switch(save, to), inlined where it is used: pushes where to resume (label 1) and the
// callee-saved registers of the System V x86-64 ABI on the current stack, stores the stack
// pointer in *save, loads `to`, pops the registers saved there and jumps to where that
// context resumes. What a switch must keep is exactly what a function call keeps (the rest
// is declared clobbered), so this is all of it: no signal mask (swapcontext's system call),
// no jmp_buf pointer mangling or cleanup-handler walk (glibc's longjmp). MXCSR and the x87
// control word are never changed by the kernels, so they are not saved.
// Why a jump and not call/ret: the processor predicts a `ret` from its stack of return
// addresses, which a switch always breaks (the scheduler's call returns into a fiber, the
// fiber's into the scheduler), and every return up the resumed fiber's frames then missed
// too. With no call or ret in a switch, a fiber's returns find the addresses the other
// threads' identical calls pushed, and each jump's few targets are predicted by address.
// The 128 bytes below the stack pointer (the ABI's red zone, which the compiler may use
// without moving it) are stepped over before the pushes.
static inline __attribute__((always_inline)) void fiber_switch(void** save, void* to) {
  __asm__ volatile(
      "leaq -128(%%rsp), %%rsp\n\t"
      "leaq 1f(%%rip), %%rax\n\t"
      "pushq %%rax\n\t"
      "pushq %%rbp\n\tpushq %%rbx\n\tpushq %%r12\n\tpushq %%r13\n\tpushq %%r14\n\tpushq %%r15\n\t"
      "movq %%rsp, (%0)\n\t"
      "movq %1, %%rsp\n\t"
      "popq %%r15\n\tpopq %%r14\n\tpopq %%r13\n\tpopq %%r12\n\tpopq %%rbx\n\tpopq %%rbp\n\t"
      "popq %%rcx\n\t"
      "jmpq *%%rcx\n"
      "1:\n\t"
      "leaq 128(%%rsp), %%rsp"
      : "+D"(save), "+S"(to)
      :
      : "rax", "rcx", "rdx", "r8", "r9", "r10", "r11", "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4",
        "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
}

// A fiber saves where it stands and switches to the scheduler, which switches back later.
static inline __attribute__((always_inline)) void yield_to_scheduler(void) {
  fiber* f = &E.fibers[E.current];
  fiber_switch(&f->sp, E.scheduler);
}
#else
// Switching is _setjmp/_longjmp (no signal-mask system call, unlike swapcontext): a
// fiber saves where it stands and jumps to the scheduler, which jumps back later.
static void yield_to_scheduler(void) {
  fiber* f = &E.fibers[E.current];
  if (!_setjmp(f->jump)) _longjmp(E.scheduler, 1);
}
#endif

void metal_emulation_barrier(int line, int column) {
  fiber* f = &E.fibers[E.current];
  f->state = AT_BARRIER;
  f->line = line;
  f->column = column;
  yield_to_scheduler();
}

// The lanes of the calling thread's SIMD-group (bit i: lane i), whatever they are doing:
// 32 bits, or fewer in a group's last, partial SIMD-group (simd_vote::all).
unsigned metal_emulation_simd_lanes(void) {
  int s = E.current / SIMD_WIDTH, width = E.nthreads - s * SIMD_WIDTH;
  return width >= SIMD_WIDTH ? 0xFFFFFFFFu : (1u << width) - 1u;
}

float metal_emulation_simd_f32(int op, float value, int arg, int line, int column) {
  fiber* f = &E.fibers[E.current];
  f->state = AT_SIMD;
  f->op = op;
  f->value = value;
  f->arg = arg;
  f->line = line;
  f->column = column;
  yield_to_scheduler();
  return f->result;
}

// A float holding a half (kind 3) or a bfloat (kind 4) rounded to the type, to nearest even
// (a bfloat's NaN stays a quiet NaN); any other kind unchanged.
static float simd_narrow(int kind, float r) {
  if (kind == 3) return __gnu_h2f_ieee(__gnu_f2h_ieee(r));
  if (kind != 4) return r;
  uint32_t b;
  memcpy(&b, &r, 4);
  b = (b & 0x7FFFFFFFu) > 0x7F800000u ? (b | 0x400000u) & 0xFFFF0000u : (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  memcpy(&r, &b, 4);
  return r;
}

// One step of a SIMD-group reduction or prefix sum: a (op) b on values of `kind` carried in a
// float's bits (0 float, 1 int, 2 uint, 3 half, 4 bfloat held in a float: each step rounded
// to the type, as Metal computes in it).
static float simd_combine(int op, int kind, float a, float b) {
  if (kind == 1 || kind == 2) {
    uint32_t x, y, r;
    memcpy(&x, &a, 4);
    memcpy(&y, &b, 4);
    if (op == 3 || op == 5) {
      int gt = kind == 1 ? (int32_t)x > (int32_t)y : x > y;
      r = (op == 3) == gt ? x : y;
    } else {
      r = op == 6 ? x * y : x + y;  // two's complement: the same bits for int and uint
    }
    float f;
    memcpy(&f, &r, 4);
    return f;
  }
  float r = op == 3 ? (a > b ? a : b) : op == 5 ? (a < b ? a : b) : op == 6 ? a * b : a + b;
  return simd_narrow(kind, r);
}

static float simd_identity(int op, int kind) {
  if (kind == 1 || kind == 2) {
    uint32_t z = op == 6 ? 1u : 0u;
    float f;
    memcpy(&f, &z, 4);
    return f;
  }
  return op == 6 ? 1.0f : 0.0f;
}

// The results of one SIMD-group operation over the lanes in `active` (bit i: lane i; the
// SIMD-group has n lanes). The reductions (sum, max, min, product) combine in a butterfly
// (xor 16, 8, 4, 2, 1, as the CUDA twin does) in which an inactive or missing lane holds no
// value and contributes nothing, so every active lane gets the same bits and a full
// SIMD-group adds exactly as before. Prefix sums add the active lanes below (and, inclusive,
// at) each lane in ascending lane order. A shuffle or broadcast from an inactive lane is
// refused (Metal leaves its value undefined); from a lane past the SIMD-group (a shuffle
// up or down past its edge included) the lane keeps its own value. Returns 0, or 1 with the
// message written.
static int simd_release(unsigned g, int s, fiber* lanes, int n, unsigned active) {
  float v[SIMD_WIDTH];
  int first = 0;
  while (!(active >> first & 1u)) ++first;
  for (int i = 0; i < n; ++i) v[i] = lanes[i].value;
  int op = lanes[first].op & 0xFF, kind = lanes[first].op >> 8;
  int reduction = op == 0 || op == 3 || op == 5 || op == 6;
  if ((op == 0 || op == 3) && kind == 0 && n == SIMD_WIDTH && active == 0xFFFFFFFFu) {
    // A full SIMD-group, every lane active: the same butterfly with nothing absent (the
    // same additions in the same order, so the same bits), written so it vectorises.
    float t[SIMD_WIDTH], u[SIMD_WIDTH];
    memcpy(t, v, sizeof t);
    for (int h = SIMD_WIDTH / 2; h >= 1; h >>= 1) {
      if (op == 0) {
        for (int i = 0; i < SIMD_WIDTH; ++i) u[i] = t[i] + t[i ^ h];
      } else {
        for (int i = 0; i < SIMD_WIDTH; ++i) u[i] = t[i] > t[i ^ h] ? t[i] : t[i ^ h];
      }
      memcpy(t, u, sizeof u);
    }
    for (int i = 0; i < SIMD_WIDTH; ++i) lanes[i].result = t[i];
  } else if (reduction) {
    float t[SIMD_WIDTH];
    int has[SIMD_WIDTH];
    for (int i = 0; i < SIMD_WIDTH; ++i) {
      has[i] = i < n && (active >> i & 1u);
      t[i] = has[i] ? v[i] : 0.0f;
    }
    for (int h = SIMD_WIDTH / 2; h >= 1; h >>= 1) {
      float u[SIMD_WIDTH];
      int uh[SIMD_WIDTH];
      for (int i = 0; i < SIMD_WIDTH; ++i) {
        int j = i ^ h;
        uh[i] = has[i] | has[j];
        u[i] = !has[j] ? t[i] : !has[i] ? t[j] : simd_combine(op, kind, t[i], t[j]);
      }
      memcpy(t, u, sizeof u);
      memcpy(has, uh, sizeof uh);
    }
    for (int i = 0; i < n; ++i)
      if (active >> i & 1u) lanes[i].result = t[i];
  } else if (op == 9 || op == 10) {  // prefix sums, ascending lane order over the active lanes
    float acc = simd_identity(0, kind);
    int any = 0;
    for (int i = 0; i < n; ++i) {
      if (!(active >> i & 1u)) continue;
      if (op == 10) lanes[i].result = acc;
      acc = any ? simd_combine(0, kind, acc, v[i]) : simd_narrow(kind, v[i]);
      any = 1;
      if (op == 9) lanes[i].result = acc;
    }
  } else if (op == 11) {  // simdgroup_barrier: the lanes only wait for each other
    for (int i = 0; i < n; ++i) lanes[i].result = 0.0f;
  } else if (op == 15) {  // simd_is_first: the active lane of the lowest index
    for (int i = 0; i < n; ++i)
      if (active >> i & 1u) {
        uint32_t r = i == first;
        memcpy(&lanes[i].result, &r, 4);
      }
  } else if (op >= 12 && op <= 14) {  // votes over the active lanes: ballot, all, any
    uint32_t ballot = 0, r;
    for (int i = 0; i < n; ++i) {
      uint32_t b;
      memcpy(&b, &v[i], 4);
      if ((active >> i & 1u) && b) ballot |= 1u << i;
    }
    r = op == 12 ? ballot : op == 13 ? ballot == active : ballot != 0;  // all, any: of the active lanes
    for (int i = 0; i < n; ++i)
      if (active >> i & 1u) memcpy(&lanes[i].result, &r, 4);
  } else {
    for (int i = 0; i < n; ++i) {
      if (!(active >> i & 1u)) continue;
      int a = lanes[i].arg;
      int src = op == 2 ? (i ^ a) : op == 7 ? i - a : op == 8 ? i + a : a;
      if (src >= 0 && src < n && !(active >> src & 1u)) {
        return fail("SIMD-group operation on line %d reads an inactive lane in group %u, SIMD-group %d: lane %d "
                    "reads lane %d, which %s line %d (Metal leaves the value undefined)", lanes[first].line, g, s,
                    i, src, lanes[src].state == DONE ? "finished; last synchronised at" :
                    lanes[src].state == AT_BARRIER ? "waits at a threadgroup barrier on" : "is elsewhere, on",
                    lanes[src].line);
      }
      lanes[i].result = (src >= 0 && src < n) ? v[src] : v[i];
    }
  }
  for (int i = 0; i < n; ++i)
    if (active >> i & 1u) lanes[i].state = RUNNABLE;
  return 0;
}

// A fiber runs one GPU thread after another: when its thread finishes it parks here, and
// the next group's thread of the same slot resumes it (start_group), so a fiber is started
// (setcontext, which costs a signal-mask system call) once a launch, not once a group.
static void fiber_main(void) {
  for (;;) {
    fiber* f = &E.fibers[E.current];  // E.current: the slot the scheduler resumed
    E.entry(E.buffers, f->ids);
    f->state = DONE;
    yield_to_scheduler();
  }
}

// ---- faults ---------------------------------------------------------------------------------

static struct sigaction old_segv, old_bus;
static char alt_stack[64 * 1024];

static int grow_window(char* a);

static void on_fault(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
  if (E.in_launch && sig == SIGSEGV && grow_window((char*)info->si_addr)) return;  // retried, now open
  if (!E.in_launch) {  // not ours: the previous handler's business
    sigaction(sig, sig == SIGSEGV ? &old_segv : &old_bus, NULL);
    return;
  }
  E.fault_addr = info->si_addr;
  siglongjmp(E.fault_jump, 1);
}

static void describe_fault(void) {
  char* a = (char*)E.fault_addr;
  const char* what = "an address outside every buffer";
  char where[160] = "";
  for (int i = 0; i < E.narrays; ++i) {
    char* end = E.arrays[i].data + E.arrays[i].bytes;
    if (a >= end && a < end + page_size()) {
      snprintf(where, sizeof where, "%ld bytes past the end of threadgroup array '%s' (%zu bytes)",
               (long)(a - end), E.arrays[i].name, E.arrays[i].bytes);
    }
  }
  if (!where[0]) {
    char* stacks_end = E.stacks + (size_t)E.max_threads * (STACK_BYTES + page_size());
    if (a >= E.stacks && a < stacks_end) what = "a thread's stack guard (the thread's stack overflowed)";
    snprintf(where, sizeof where, "%s (a guard page after a device buffer, or unmapped memory)", what);
  }
  fiber* f = &E.fibers[E.current];
  fail("memory fault in thread %u of group %u: %s, at %p", f->ids->tindex, E.group, where, (void*)a);
}

// ---- the launch --------------------------------------------------------------------------------

// Every thread of group `g` (its linear index over the grid's groups; `n` threads, the
// group's own size in each dimension `size`) at its start, its ids set.
static void start_group(unsigned g, int n, const unsigned* size) {
  size_t ps = page_size();
  E.nthreads = n;
  E.group = g;
  unsigned gc[3] = {g % E.ngroups[0], (g / E.ngroups[0]) % E.ngroups[1], g / (E.ngroups[0] * E.ngroups[1])};
  for (int t = 0; t < n; ++t) {
    fiber* f = &E.fibers[t];
    metal_emulation_ids* id = f->ids;
    unsigned tc[3] = {(unsigned)t % size[0], ((unsigned)t / size[0]) % size[1], (unsigned)t / (size[0] * size[1])};
    memset(id, 0, sizeof *id);
    for (int d = 0; d < 3; ++d) {
      id->tpitg[d] = tc[d];
      id->tgpig[d] = gc[d];
      id->tpg[d] = E.ngroups[d];
      id->threads_per_tg[d] = size[d];
      id->tpig[d] = gc[d] * E.tg[d] + tc[d];
      id->tpgrid[d] = E.grid[d];
      id->dtptg[d] = E.tg[d];
    }
    id->tindex = (unsigned)t;
    id->nsimd = ((unsigned)n + SIMD_WIDTH - 1) / SIMD_WIDTH;
    id->simd_lane = (unsigned)t % SIMD_WIDTH;
    id->simd_group = (unsigned)t / SIMD_WIDTH;
    f->next_array = 0;
    // A fiber parked by the previous group (its thread finished) resumes into its loop; one
    // not started this launch (f->started 0: the fibers are fresh each launch) starts here.
    if (!f->started || f->state != DONE) {
      char* stack = E.stacks + (size_t)t * (STACK_BYTES + ps) + ps;  // a guard page below each stack
      f->started = 0;
#if FIBER_SWITCH_ASM
      // The first switch to the fiber pops six zero registers and jumps to fiber_main (the
      // resume address popped) as if called: its return address slot (never used:
      // fiber_main never returns) sits at top - 8, so the stack pointer is 8 past a 16-byte
      // boundary at its entry, as the ABI has it at every function's entry.
      void** top = (void**)(stack + STACK_BYTES);
      top[-1] = NULL;
      top[-2] = (void*)fiber_main;
      for (int r = 3; r <= 8; ++r) top[-r] = NULL;
      f->sp = (void*)(top - 8);
#else
      f->ctx = E.blank;
      f->ctx.uc_stack.ss_sp = stack;
      f->ctx.uc_stack.ss_size = STACK_BYTES;
      f->ctx.uc_link = NULL;
      makecontext(&f->ctx, fiber_main, 0);
#endif
    }
    f->state = RUNNABLE;
  }
}

// Thread t runs until its next synchronisation (or its end).
static void run_fiber(int t) {
  fiber* f = &E.fibers[t];
  E.current = t;
#if FIBER_SWITCH_ASM
  f->started = 1;
  fiber_switch(&E.scheduler, f->sp);
#else
  if (!_setjmp(E.scheduler)) {
    if (f->started) _longjmp(f->jump, 1);
    f->started = 1;
    setcontext(&f->ctx);
  }
#endif
}

// SIMD-group s of group g, once none of its lanes can run on: the lanes waiting at a
// SIMD-group operation are released over that active set (Metal's rule: the operation
// combines the lanes that execute it; the others finished or wait at a threadgroup barrier,
// having taken another path, and none of them can reach this operation before the active
// lanes move on). Lanes waiting at two different operations are an error: whether Metal
// runs one path's operation first, or waits to reconverge, is its compiler's choice. A lane
// that skipped an earlier pass of the same call in a loop is not told apart. Returns 1
// released, 0 nothing to release (none waits, or a lane still runs), -1 an error.
static int simd_settle(unsigned g, int s) {
  int n = E.nthreads;
  fiber* lanes = &E.fibers[s * SIMD_WIDTH];
  int width = n - s * SIMD_WIDTH < SIMD_WIDTH ? n - s * SIMD_WIDTH : SIMD_WIDTH;
  int first = -1;
  unsigned active = 0;
  for (int i = 0; i < width; ++i) {
    if (lanes[i].state == RUNNABLE) return 0;
    if (lanes[i].state != AT_SIMD) continue;
    if (first < 0) first = i;
    if (lanes[i].line != lanes[first].line || lanes[i].column != lanes[first].column ||
        lanes[i].op != lanes[first].op) {
      fail("divergent SIMD-group operations in group %u, SIMD-group %d: lane %d waits at the operation on line %d, "
           "lane %d at the one on line %d (column %d); which runs first depends on where Apple's compiler "
           "reconverges the paths, which is not modelled: give every path the same operation or none",
           g, s, first, lanes[first].line, i, lanes[i].line, lanes[i].column);
      return -1;
    }
    active |= 1u << i;
  }
  if (first < 0) return 0;
  return simd_release(g, s, lanes, width, active) ? -1 : 1;
}

// No thread runnable: the group is released from its barrier, or has finished; anything
// else is a divergent barrier or a deadlock. Returns 0 released, 1 finished, -1 an error.
static int barrier_settle(unsigned g) {
  int n = E.nthreads, done = 0, at_barrier = 0;
  for (int t = 0; t < n; ++t) {
    done += E.fibers[t].state == DONE;
    at_barrier += E.fibers[t].state == AT_BARRIER;
  }
  if (done == n) return 1;
  if (at_barrier == n) {
    for (int t = 1; t < n; ++t) {
      if (E.fibers[t].line != E.fibers[0].line || E.fibers[t].column != E.fibers[0].column) {
        fail("divergent barrier in group %u: thread 0 waits at the barrier on line %d, thread %d at the one on line "
             "%d", g, E.fibers[0].line, t, E.fibers[t].line);
        return -1;
      }
    }
    for (int t = 0; t < n; ++t) E.fibers[t].state = RUNNABLE;
    return 0;
  }
  int first = -1, fin = -1;
  for (int t = 0; t < n; ++t) {
    if (E.fibers[t].state == AT_BARRIER && first < 0) first = t;
    if (E.fibers[t].state == DONE && fin < 0) fin = t;
  }
  if (first >= 0 && fin >= 0) {
    fail("divergent barrier in group %u: thread %d waits at the barrier on line %d, but thread %d finished without "
         "reaching it (%d of %d threads wait)", g, first, E.fibers[first].line, fin, at_barrier, n);
    return -1;
  }
  fail("deadlock in group %u: %d threads wait at a barrier, %d finished", g, at_barrier, done);
  return -1;
}

// The SIMD-groups in step: every runnable thread (in `order`) runs to its next
// synchronisation, then every SIMD-group whose lanes all arrived is released together.
static int run_group_in_step(unsigned g, const int* order) {
  int n = E.nthreads;
  for (;;) {
    int m = E.max_threads;
    for (int k = 0; k < m; ++k) {  // `order` covers a full group; a partial one skips the rest
      // Resuming a fiber first reads its stack where it stopped, a line in another page for
      // every thread, and that wait was most of a switch: the lines of the thread after next
      // are asked for now (a prefetch never faults, wherever it points).
      if (k + 2 < m && order[k + 2] < n) {
        const char* sp = (const char*)E.fibers[order[k + 2]].sp;
        if (sp != NULL) {
          for (int line = 0; line < 6; ++line) __builtin_prefetch(sp + 64 * line);
        }
      }
      if (order[k] < n && E.fibers[order[k]].state == RUNNABLE) run_fiber(order[k]);
    }
    int released = 0;
    for (int s = 0; s * SIMD_WIDTH < n; ++s) {
      int r = simd_settle(g, s);
      if (r < 0) return 1;
      released |= r;
    }
    if (released) continue;
    int b = barrier_settle(g);
    if (b < 0) return 1;
    if (b == 1) return 0;
  }
}

static unsigned long long next_random(void) {
  E.rng = E.rng * 6364136223846793005ull + 1442695040888963407ull;
  return E.rng >> 33;
}

// The SIMD-groups apart. APART_ASCENDING / _DESCENDING: the first SIMD-group (in that
// order) with a runnable lane runs it to its next synchronisation; so SIMD-group 0 (or the
// last) goes as far as it can, to a threadgroup barrier or its end, before the next one
// starts. APART_RANDOM: a random runnable thread at every step. A SIMD-group is released
// as soon as its last lane reaches the operation.
static int run_group_apart(unsigned g, int kind) {
  int n = E.nthreads, nsg = (n + SIMD_WIDTH - 1) / SIMD_WIDTH;
  int* ready = malloc(sizeof(int) * (size_t)n);  // the random schedule's runnable threads
  int rc = 0;
  for (;;) {
    int t = -1;
    if (kind == APART_RANDOM) {
      int m = 0;
      for (int i = 0; i < n; ++i)
        if (E.fibers[i].state == RUNNABLE) ready[m++] = i;
      while (m > 0) {  // run the runnable threads in a random order, one step each, re-drawing as they stop
        int k = (int)(next_random() % (unsigned long long)m);
        t = ready[k];
        ready[k] = ready[--m];
        run_fiber(t);
        int r = simd_settle(g, t / SIMD_WIDTH);
        if (r < 0) { rc = 1; goto out; }
        if (r == 1) {  // the released (active) lanes join the draw; inactive ones stay where they wait
          int lo = (t / SIMD_WIDTH) * SIMD_WIDTH, hi = lo + SIMD_WIDTH < n ? lo + SIMD_WIDTH : n;
          for (int i = lo; i < hi; ++i)
            if (E.fibers[i].state == RUNNABLE) ready[m++] = i;
        }
      }
      t = -1;
    } else {
      for (int k = 0; k < nsg && t < 0; ++k) {
        int s = kind == APART_ASCENDING ? k : nsg - 1 - k;
        int lo = s * SIMD_WIDTH, hi = lo + SIMD_WIDTH < n ? lo + SIMD_WIDTH : n;
        for (int j = 0; j < hi - lo && t < 0; ++j) {
          int i = kind == APART_ASCENDING ? lo + j : hi - 1 - j;
          if (E.fibers[i].state == RUNNABLE) t = i;
        }
      }
      if (t >= 0) {
        run_fiber(t);
        if (simd_settle(g, t / SIMD_WIDTH) < 0) { rc = 1; goto out; }
        continue;
      }
    }
    int b = barrier_settle(g);
    if (b < 0) { rc = 1; goto out; }
    if (b == 1) break;
  }
out:
  free(ready);
  return rc;
}

// The fiber stacks: one mapping kept from launch to launch (grown when a launch needs more
// threads), each stack with a guard page below it. At every launch the stacks are zeroed
// (stacks_ready), so every launch starts on zero-filled stacks exactly as on a fresh
// mapping: whatever a thread reads from its stack before writing it cannot depend on
// an earlier launch. (Reusing the pages as they were did: a mutant with a dropped barrier
// then faulted on a value an earlier launch had left on a stack.) What reuse saves is the
// mmap, the guard pages' mprotect a thread, and the munmap, every launch.
//
// Which pages to zero: only the top `window` pages of each stack are readable and
// writable; the rest of it is protected like the guard page below it. So nothing below the
// window can hold data, and zeroing the window zeroes everything a launch could have left.
// A thread that reaches below the window faults once; the handler (grow_window) opens the
// window down to the faulting page on every stack, and the access is retried. The
// window only grows, and is one page for the project's kernels. (Within a launch, a stack
// passes from a slot's thread in one group to that slot's thread in the next as it is.) (Asking the kernel which
// pages are in memory instead, mincore over every stack's 64 pages, cost 2.3 ms a tail
// at the test shape: more than the kernels.)
//
// Every kernel's shared object carries its own copy of this runtime, so the stacks are
// allocated by the caller (metal_emulation_stacks) and handed to whichever kernel launches
// (metal_emulation_use_stacks): one mapping for the process, its first page a header that
// every copy reads (the window). A mapping a kernel would keep for itself costs two memory
// areas a thread (a guard page splits it), and a few dozen kernels of 1024 threads reach
// Linux's limit on a process's areas (65,530).
typedef struct {
  size_t window;  // pages at the top of every stack that are open (and may hold data)
  int nthreads;
} stack_header;

static char* stack_pool;  // the header page; stack t's guard page at stack_pool + page + t * (STACK_BYTES + page)
static int stack_pool_threads;

static char* stack_top(int t) {
  size_t ps = page_size();
  return stack_pool + ps + (size_t)t * (STACK_BYTES + ps) + ps + STACK_BYTES;
}

// `nthreads` stacks of STACK_BYTES, a guard page below each, after a header page; the top
// page of each open. NULL when out of memory.
void* metal_emulation_stacks(int nthreads) {
  size_t ps = page_size();
  char* pool = mmap(NULL, ps + (size_t)nthreads * (STACK_BYTES + ps), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (pool == MAP_FAILED) return NULL;
  stack_header* h = (stack_header*)pool;
  h->window = 1;
  h->nthreads = nthreads;
  for (int t = 0; t < nthreads; ++t) {  // the guard page and all but the window, in one call
    char* guard = pool + ps + (size_t)t * (STACK_BYTES + ps);
    if (mprotect(guard, ps + STACK_BYTES - h->window * ps, PROT_NONE) != 0) {
      munmap(pool, ps + (size_t)nthreads * (STACK_BYTES + ps));
      return NULL;
    }
  }
  return pool;
}

void metal_emulation_stacks_free(void* pool, int nthreads) {
  munmap(pool, page_size() + (size_t)nthreads * (STACK_BYTES + page_size()));
}

// The stacks the following launches use (from metal_emulation_stacks, for `nthreads`).
void metal_emulation_use_stacks(void* pool, int nthreads) {
  stack_pool = pool;
  stack_pool_threads = nthreads;
}

// A fault at `a`: when it is inside a stack, below its window, open the window of every
// stack down to `a`'s page and return 1 (the access is retried); else 0.
// Runs in the signal handler: only system calls and arithmetic.
static int grow_window(char* a) {
  if (stack_pool == NULL) return 0;
  size_t ps = page_size(), slot = STACK_BYTES + ps;
  stack_header* h = (stack_header*)stack_pool;
  char* first = stack_pool + ps;
  if (a < first || a >= first + (size_t)h->nthreads * slot) return 0;
  size_t t = (size_t)(a - first) / slot;
  char* top = first + t * slot + slot;
  if (a < first + t * slot + ps) return 0;  // the guard page: the stack overflowed
  size_t need = ((size_t)(top - a) + ps - 1) / ps;
  if (need > STACK_BYTES / ps) need = STACK_BYTES / ps;
  if (need <= h->window) return 0;  // open already: not ours
  for (int u = 0; u < h->nthreads; ++u) {
    char* tu = stack_top(u);
    if (mprotect(tu - need * ps, (need - h->window) * ps, PROT_READ | PROT_WRITE) != 0) return 0;
  }
  h->window = need;
  return 1;
}

// The part of a stack's window, at its top, zeroed through the cache; the rest of the window
// is zeroed with non-temporal stores, which bypass it. The kernels' threads use well under
// this (470-712 bytes at the test shape), so the lines a thread reads are in the cache when
// it starts, and the rest of the window (three quarters of every page, 2.5 MB a tail at the
// test shape) no longer evicts what the fibers and the caller use: 10% less CPU a tail,
// measured. Every byte of the window is zeroed either way; this is only where the stores go.
#define STACK_HOT_BYTES 1024

// The first `nthreads` stacks zeroed: the window of each (below it nothing can be written).
static int stacks_ready(int nthreads) {
  if (stack_pool == NULL || nthreads > stack_pool_threads) return 0;
  size_t ps = page_size(), w = ((stack_header*)stack_pool)->window * ps;
  size_t hot = w < STACK_HOT_BYTES ? w : STACK_HOT_BYTES;
  for (int t = 0; t < nthreads; ++t) {
    char* top = stack_top(t);
#if defined(__SSE2__)
    const __m128i zero = _mm_setzero_si128();
    for (__m128i* q = (__m128i*)(top - w); q < (__m128i*)(top - hot); q += 4) {  // whole 64-byte lines
      _mm_stream_si128(q, zero);
      _mm_stream_si128(q + 1, zero);
      _mm_stream_si128(q + 2, zero);
      _mm_stream_si128(q + 3, zero);
    }
    memset(top - hot, 0, hot);
#else
    memset(top - w, 0, w);
#endif
  }
#if defined(__SSE2__)
  _mm_sfence();  // the streamed zeros are ordered before anything the launch does next
#endif
  E.stacks = stack_pool + ps;
  return 1;
}

// Runs `entry` over a grid of grid[0] x grid[1] x grid[2] threads in groups of tg[0] x
// tg[1] x tg[2] (dispatchThreads: partial groups at the grid's edges). schedule: one of
// the enum above; `seed` for the shuffled and random ones (the groups, in their linear
// order, are run ascending, descending, or shuffled with it). tg_limit: threadgroup memory
// a group, in bytes. Returns 0, or 1 with a message in `error`.
int metal_emulation_launch(entry_fn entry, void* const* buffers, const unsigned* grid, const unsigned* tg,
                           int schedule, unsigned long seed, unsigned long tg_limit, char* error, size_t error_cap) {
  E.error = error;
  E.error_cap = error_cap;
  error[0] = 0;
  unsigned long long total = 1, groups = 1;
  for (int d = 0; d < 3; ++d) {
    if (grid[d] < 1 || tg[d] < 1) return fail("grid and threadgroup must be at least 1 in every dimension");
    E.grid[d] = grid[d];
    E.tg[d] = tg[d];
    E.ngroups[d] = (grid[d] + tg[d] - 1) / tg[d];
    total *= tg[d];
    groups *= E.ngroups[d];
  }
  if (total > MAX_THREADS) return fail("threads a group must be 1..%d; got %llu", MAX_THREADS, total);
  if (groups > 0xFFFFFFFFull) return fail("too many threadgroups: %llu", groups);
  int nthreads = (int)total;
  unsigned ngroups = (unsigned)groups;
  if (schedule < LOCKSTEP_ASCENDING || schedule > APART_RANDOM) return fail("no schedule %d", schedule);
  E.entry = entry;
  E.buffers = buffers;
  E.max_threads = nthreads;
  E.tg_limit = tg_limit;
  if (!stacks_ready(nthreads))
    return fail("no fiber stacks for %d threads (metal_emulation_use_stacks gave %d)", nthreads, stack_pool_threads);
  E.fibers = aligned_alloc(64, (size_t)nthreads * sizeof(fiber));
  E.ids = calloc((size_t)nthreads, sizeof(metal_emulation_ids));
  if (E.fibers == NULL || E.ids == NULL) {
    free(E.fibers);
    free(E.ids);
    return fail("no memory for %d fibers", nthreads);
  }
  memset(E.fibers, 0, (size_t)nthreads * sizeof(fiber));
  for (int t = 0; t < nthreads; ++t) E.fibers[t].ids = &E.ids[t];
#if !FIBER_SWITCH_ASM
  getcontext(&E.blank);
#endif
  int* order = malloc(sizeof(int) * (size_t)nthreads);
  unsigned* gorder = malloc(sizeof(unsigned) * (ngroups ? ngroups : 1));
  int descending = schedule == LOCKSTEP_DESCENDING || schedule == APART_DESCENDING;
  int shuffled = schedule == LOCKSTEP_SHUFFLED || schedule == APART_RANDOM;
  unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < nthreads; ++i) order[i] = descending ? nthreads - 1 - i : i;
  for (unsigned i = 0; i < ngroups; ++i) gorder[i] = descending ? ngroups - 1 - i : i;
  if (shuffled) {  // Fisher-Yates with a 64-bit LCG: the same shuffle for the same seed everywhere
    for (int i = nthreads - 1; i > 0; --i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      int j = (int)((s >> 33) % (unsigned long long)(i + 1));
      int tmp = order[i]; order[i] = order[j]; order[j] = tmp;
    }
    for (unsigned i = ngroups ? ngroups - 1 : 0; i > 0; --i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      unsigned j = (unsigned)((s >> 33) % (unsigned long long)(i + 1));
      unsigned tmp = gorder[i]; gorder[i] = gorder[j]; gorder[j] = tmp;
    }
  }
  E.rng = s;
  stack_t ss = {.ss_sp = alt_stack, .ss_size = sizeof alt_stack, .ss_flags = 0}, old_ss;
  sigaltstack(&ss, &old_ss);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &old_segv);
  sigaction(SIGBUS, &sa, &old_bus);
  int rc = 0;
  E.in_launch = 1;
  int jumped = sigsetjmp(E.fault_jump, 1);
  if (jumped == 1) {
    describe_fault();
    rc = 1;
  } else if (jumped == 2) {
    rc = 1;  // the message is written
  } else {
    for (unsigned k = 0; k < ngroups && rc == 0; ++k) {
      unsigned g = gorder[k];
      unsigned gc[3] = {g % E.ngroups[0], (g / E.ngroups[0]) % E.ngroups[1], g / (E.ngroups[0] * E.ngroups[1])};
      unsigned size[3];
      for (int d = 0; d < 3; ++d) {
        size[d] = E.grid[d] - gc[d] * E.tg[d];
        if (size[d] > E.tg[d]) size[d] = E.tg[d];
      }
      start_group(g, (int)(size[0] * size[1] * size[2]), size);
      rc = schedule <= LOCKSTEP_SHUFFLED ? run_group_in_step(g, order) : run_group_apart(g, schedule);
      free_arrays();
    }
  }
  E.in_launch = 0;
  free_arrays();
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  sigaltstack(&old_ss, NULL);
  free(E.fibers);
  free(E.ids);
  free(order);
  free(gorder);
  return rc;
}
