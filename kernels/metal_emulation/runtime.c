// The emulator: one launch of a compiled Metal kernel on the CPU, every GPU thread a
// fiber (ucontext), threadgroups one after another.
//
// What it models (kernels/README.md, "Metal on the CPU"):
// - barriers: a group is released only when EVERY thread of it waits at the SAME
//   threadgroup_barrier call (its line and column in the generated source); threads at
//   different barriers, or some finished while others wait, is a divergent barrier;
// - SIMD-groups of 32 lanes (lane = thread % 32): simd_sum and the shuffles release a
//   SIMD-group when all its lanes reached the same call, and combine in one fixed order;
// - threadgroup memory: fresh for every group, every byte 0xFF (a NaN in any float),
//   at most 32,768 bytes a group (Apple GPUs' limit), each array ending at a guard page;
// - device buffers are allocated by the caller with metal_emulation_buffer (ending at a
//   guard page, outputs NaN-filled);
// - the order threads run between synchronisations, and the order of the groups:
//   ascending, descending or shuffled; a result that depends on it is a race.
// A fault (a guard page, a fiber's stack overflow) is caught and reported, not a crash.
#define _GNU_SOURCE
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#define SIMD_WIDTH 32
#define THREADGROUP_LIMIT 32768
#define MAX_ARRAYS 16
#define STACK_BYTES (256 * 1024)
#define MAX_THREADS 1024

enum { RUNNABLE = 0, AT_BARRIER = 1, AT_SIMD = 2, DONE = 3 };

typedef struct {
  unsigned tpitg[3], tgpig[3], tpg[3];  // thread_position_in_threadgroup, threadgroup_position_in_grid, threadgroups_per_grid
  unsigned simd_lane, simd_group, threads_per_tg[3];
} metal_emulation_ids;

typedef void (*entry_fn)(void* const* buffers, const metal_emulation_ids* ids);

typedef struct {
  ucontext_t ctx;   // the fiber's start (makecontext); switches after that are _setjmp/_longjmp
  jmp_buf jump;     // where the fiber resumes
  int started;
  int state, line, column, op, arg, next_array;
  float value, result;
  metal_emulation_ids ids;
} fiber;

typedef struct {
  char* base;      // the mapping: data pages then one guard page
  size_t mapped;   // bytes mapped
  char* data;      // the array: it ends where the guard page starts
  size_t bytes;
  char name[64];
} tg_array;

static struct {
  fiber* fibers;
  char* stacks;
  int nthreads, current;
  jmp_buf scheduler;
  ucontext_t blank;  // one getcontext, copied for every fiber's start
  entry_fn entry;
  void* const* buffers;
  tg_array arrays[MAX_ARRAYS];
  int narrays;
  size_t tg_bytes;
  char* error;
  size_t error_cap;
  sigjmp_buf fault_jump;
  volatile void* fault_addr;
  int in_launch;
} E;

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static int fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
#include <stdarg.h>
static int fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(E.error, E.error_cap, fmt, ap);
  va_end(ap);
  return 1;
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

static void free_arrays(void) {
  for (int i = 0; i < E.narrays; ++i) munmap(E.arrays[i].base, E.arrays[i].mapped);
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
    if (E.arrays[k].bytes != bytes || strcmp(E.arrays[k].name, name) != 0) {
      fail("threadgroup array %d is '%s' (%lu bytes) in one thread and '%s' (%zu bytes) in another: "
           "threadgroup declarations must be the same in every thread", k, name, bytes, E.arrays[k].name,
           E.arrays[k].bytes);
      siglongjmp(E.fault_jump, 2);
    }
    return E.arrays[k].data;
  }
  size_t rounded = (bytes + 15) & ~(size_t)15;  // Metal rounds each allocation to 16 bytes
  if (E.tg_bytes + rounded > THREADGROUP_LIMIT || k >= MAX_ARRAYS) {
    fail("threadgroup memory over Apple GPUs' limit: '%s' (%lu bytes) brings the group to %zu bytes, more than %d",
         name, bytes, E.tg_bytes + rounded, THREADGROUP_LIMIT);
    siglongjmp(E.fault_jump, 2);
  }
  size_t ps = page_size();
  size_t data_pages = (bytes + ps - 1) / ps;
  if (data_pages == 0) data_pages = 1;
  tg_array* a = &E.arrays[k];
  a->mapped = (data_pages + 1) * ps;
  a->base = mmap(NULL, a->mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  mprotect(a->base + data_pages * ps, ps, PROT_NONE);
  // The array ends at the guard page (rounded down to its alignment, at most align - 1
  // bytes before it: the kernels' arrays are multiples of 16 bytes, so none).
  uintptr_t end = (uintptr_t)(a->base + data_pages * ps);
  a->data = (char*)((end - bytes) & ~(uintptr_t)(align - 1));
  a->bytes = bytes;
  snprintf(a->name, sizeof a->name, "%s", name);
  memset(a->base, 0xFF, data_pages * ps);  // NaN in every float: a read before a write shows
  E.narrays = k + 1;
  E.tg_bytes += rounded;
  return a->data;
}

// ---- synchronisation --------------------------------------------------------------------------

// Switching is _setjmp/_longjmp (no signal-mask system call, unlike swapcontext): a
// fiber saves where it stands and jumps to the scheduler, which jumps back later.
static void yield_to_scheduler(void) {
  fiber* f = &E.fibers[E.current];
  if (!_setjmp(f->jump)) _longjmp(E.scheduler, 1);
}

void metal_emulation_barrier(int line, int column) {
  fiber* f = &E.fibers[E.current];
  f->state = AT_BARRIER;
  f->line = line;
  f->column = column;
  yield_to_scheduler();
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

// The 32 lanes' results of one SIMD-group operation. simd_sum adds in a butterfly (xor
// 16, 8, 4, 2, 1, as the CUDA twin does), so every lane gets the same bits.
static void simd_release(fiber* lanes, int n) {
  float v[SIMD_WIDTH];
  for (int i = 0; i < n; ++i) v[i] = lanes[i].value;
  int op = lanes[0].op;
  if (op == 0 || op == 3) {  // sum, max
    float t[SIMD_WIDTH];
    memcpy(t, v, sizeof v);
    for (int h = SIMD_WIDTH / 2; h >= 1; h >>= 1) {
      float u[SIMD_WIDTH];
      for (int i = 0; i < n; ++i) {
        int j = i ^ h;
        float o = j < n ? t[j] : (op == 0 ? 0.0f : t[i]);
        u[i] = op == 0 ? t[i] + o : (t[i] > o ? t[i] : o);
      }
      memcpy(t, u, sizeof u);
    }
    for (int i = 0; i < n; ++i) lanes[i].result = t[i];
  } else {
    for (int i = 0; i < n; ++i) {
      int src = op == 2 ? (i ^ lanes[i].arg) : lanes[i].arg;
      lanes[i].result = (src >= 0 && src < n) ? v[src] : v[i];
    }
  }
  for (int i = 0; i < n; ++i) lanes[i].state = RUNNABLE;
}

static void fiber_main(void) {
  fiber* f = &E.fibers[E.current];
  E.entry(E.buffers, &f->ids);
  f->state = DONE;
  _longjmp(E.scheduler, 1);
}

// ---- faults ---------------------------------------------------------------------------------

static struct sigaction old_segv, old_bus;
static char alt_stack[64 * 1024];

static void on_fault(int sig, siginfo_t* info, void* uctx) {
  (void)uctx;
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
    char* stacks_end = E.stacks + (size_t)E.nthreads * (STACK_BYTES + page_size());
    if (a >= E.stacks && a < stacks_end) what = "a thread's stack guard (the thread's stack overflowed)";
    snprintf(where, sizeof where, "%s (a guard page after a device buffer, or unmapped memory)", what);
  }
  fiber* f = &E.fibers[E.current];
  fail("memory fault in thread %u of group %u: %s, at %p", f->ids.tpitg[0], f->ids.tgpig[0], where, (void*)a);
}

// ---- the launch --------------------------------------------------------------------------------

static int run_group(unsigned g, unsigned ngroups, const int* order) {
  int n = E.nthreads;
  size_t ps = page_size();
  for (int t = 0; t < n; ++t) {
    fiber* f = &E.fibers[t];
    memset(&f->ids, 0, sizeof f->ids);
    f->ids.tpitg[0] = (unsigned)t;
    f->ids.tgpig[0] = g;
    f->ids.tpg[0] = ngroups;
    f->ids.tpg[1] = f->ids.tpg[2] = 1;
    f->ids.threads_per_tg[0] = (unsigned)n;
    f->ids.threads_per_tg[1] = f->ids.threads_per_tg[2] = 1;
    f->ids.simd_lane = (unsigned)t % SIMD_WIDTH;
    f->ids.simd_group = (unsigned)t / SIMD_WIDTH;
    f->state = RUNNABLE;
    f->next_array = 0;
    f->started = 0;
    f->ctx = E.blank;
    f->ctx.uc_stack.ss_sp = E.stacks + (size_t)t * (STACK_BYTES + ps) + ps;  // a guard page below each stack
    f->ctx.uc_stack.ss_size = STACK_BYTES;
    f->ctx.uc_link = NULL;
    makecontext(&f->ctx, fiber_main, 0);
  }
  for (;;) {
    for (int k = 0; k < n; ++k) {
      int t = order[k];
      fiber* f = &E.fibers[t];
      if (f->state == RUNNABLE) {
        E.current = t;
        if (!_setjmp(E.scheduler)) {
          if (f->started) _longjmp(f->jump, 1);
          f->started = 1;
          setcontext(&f->ctx);
        }
      }
    }
    int done = 0, at_barrier = 0, released = 0;
    for (int t = 0; t < n; ++t) {
      done += E.fibers[t].state == DONE;
      at_barrier += E.fibers[t].state == AT_BARRIER;
    }
    if (done == n) break;
    for (int s = 0; s * SIMD_WIDTH < n; ++s) {
      fiber* lanes = &E.fibers[s * SIMD_WIDTH];
      int width = n - s * SIMD_WIDTH < SIMD_WIDTH ? n - s * SIMD_WIDTH : SIMD_WIDTH;
      int at = 0;
      for (int i = 0; i < width; ++i) at += lanes[i].state == AT_SIMD;
      if (at == 0) continue;
      for (int i = 0; i < width; ++i) {
        if (lanes[i].state != AT_SIMD || lanes[i].line != lanes[0].line || lanes[i].column != lanes[0].column ||
            lanes[i].op != lanes[0].op) {
          if (lanes[i].state == RUNNABLE) continue;
          return fail("divergent SIMD-group operation in group %u, SIMD-group %d: lane 0 at the operation on line "
                      "%d, lane %d %s line %d", g, s, lanes[0].line, i,
                      lanes[i].state == DONE ? "finished; last synchronised at" :
                      lanes[i].state == AT_BARRIER ? "waits at a threadgroup barrier on" : "at an operation on",
                      lanes[i].line);
        }
      }
      simd_release(lanes, width);
      released = 1;
    }
    if (released) continue;
    if (at_barrier == n) {
      for (int t = 1; t < n; ++t) {
        if (E.fibers[t].line != E.fibers[0].line || E.fibers[t].column != E.fibers[0].column) {
          return fail("divergent barrier in group %u: thread 0 waits at the barrier on line %d, thread %d at the "
                      "one on line %d", g, E.fibers[0].line, t, E.fibers[t].line);
        }
      }
      for (int t = 0; t < n; ++t) E.fibers[t].state = RUNNABLE;
      continue;
    }
    int first = -1, fin = -1;
    for (int t = 0; t < n; ++t) {
      if (E.fibers[t].state == AT_BARRIER && first < 0) first = t;
      if (E.fibers[t].state == DONE && fin < 0) fin = t;
    }
    if (first >= 0 && fin >= 0) {
      return fail("divergent barrier in group %u: thread %d waits at the barrier on line %d, but thread %d finished "
                  "without reaching it (%d of %d threads wait)", g, first, E.fibers[first].line, fin, at_barrier, n);
    }
    return fail("deadlock in group %u: %d threads wait at a barrier, %d finished", g, at_barrier, done);
  }
  return 0;
}

// Runs `entry` over `ngroups` groups of `nthreads` threads. order: 0 ascending, 1
// descending, 2 shuffled by `seed` (the threads between synchronisations, and the groups).
// Returns 0, or 1 with a message in `error`.
int metal_emulation_launch(entry_fn entry, void* const* buffers, unsigned ngroups, int nthreads, int order_kind,
                           unsigned long seed, char* error, size_t error_cap) {
  E.error = error;
  E.error_cap = error_cap;
  error[0] = 0;
  if (nthreads < 1 || nthreads > MAX_THREADS) return fail("threads a group must be 1..%d; got %d", MAX_THREADS, nthreads);
  E.entry = entry;
  E.buffers = buffers;
  E.nthreads = nthreads;
  size_t ps = page_size();
  size_t stack_span = (size_t)nthreads * (STACK_BYTES + ps);
  E.stacks = mmap(NULL, stack_span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (E.stacks == MAP_FAILED) return fail("no memory for %d fiber stacks", nthreads);
  for (int t = 0; t < nthreads; ++t) mprotect(E.stacks + (size_t)t * (STACK_BYTES + ps), ps, PROT_NONE);
  E.fibers = calloc((size_t)nthreads, sizeof(fiber));
  getcontext(&E.blank);
  int* order = malloc(sizeof(int) * (size_t)nthreads);
  unsigned* gorder = malloc(sizeof(unsigned) * (ngroups ? ngroups : 1));
  unsigned long long s = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (int i = 0; i < nthreads; ++i) order[i] = order_kind == 1 ? nthreads - 1 - i : i;
  for (unsigned i = 0; i < ngroups; ++i) gorder[i] = order_kind == 1 ? ngroups - 1 - i : i;
  if (order_kind == 2) {  // Fisher-Yates with a 64-bit LCG: the same shuffle for the same seed everywhere
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
      rc = run_group(gorder[k], ngroups, order);
      free_arrays();
    }
  }
  E.in_launch = 0;
  free_arrays();
  sigaction(SIGSEGV, &old_segv, NULL);
  sigaction(SIGBUS, &old_bus, NULL);
  sigaltstack(&old_ss, NULL);
  munmap(E.stacks, stack_span);
  free(E.fibers);
  free(order);
  free(gorder);
  return rc;
}
