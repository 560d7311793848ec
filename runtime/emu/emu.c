/* emu.c - the host device's launcher and block scheduler.
 *
 * See kiln_emu.h for the model.  In short: kl_emu_launch hands out blocks to
 * a worker pool; a worker runs a block's threads as a plain loop until one of
 * them calls a barrier or warp collective, and from then on as fibers that
 * switch at every wait (symmetric: the waiting fiber picks the next one).
 *
 * _GNU_SOURCE: sched_getaffinity (CPUs we may use), MAP_ANONYMOUS/
 * MAP_NORESERVE, and ucontext on targets without the hand-written switch.
 * The code itself is C11. */
#define _GNU_SOURCE
#include "emu.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- context switching ----------------------------------------------------- */
/* x86-64 gets a 20-instruction switch; swapcontext would also save the signal
 * mask with a system call at every switch (see README for the numbers).
 * Other targets, or -DKL_EMU_UCONTEXT, use ucontext. */
#if defined(__x86_64__) && !defined(KL_EMU_UCONTEXT)
#define KL_ASM_SWITCH 1
#else
#define KL_ASM_SWITCH 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define KL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KL_ASAN 1
#endif
#endif
#ifndef KL_ASAN
#define KL_ASAN 0
#endif
#if KL_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__SANITIZE_THREAD__)
#define KL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KL_TSAN 1
#endif
#endif
#ifndef KL_TSAN
#define KL_TSAN 0
#endif
#if KL_TSAN /* TSan must be told which "thread" each stack is */
#include <sanitizer/tsan_interface.h>
#endif

typedef struct kl_ctx {
#if KL_ASM_SWITCH
  void *sp; /* saved stack pointer; the registers are on that stack */
#else
  ucontext_t uc;
#endif
  /* The stack this context runs on, for ASan's fiber annotations; learned
   * when we first switch away from a stack we did not allocate. */
  const void *stack_lo;
  size_t stack_size;
#if KL_TSAN
  void *tsan_fiber;
#endif
} kl_ctx;

#if KL_ASM_SWITCH
/* kl_emu_switch(&from->sp, to->sp): push the callee-saved registers and the
 * SSE/x87 control words (callee-saved in the SysV ABI), save rsp, load the
 * other rsp, pop its registers, return into it. */
void kl_emu_switch(void **save_sp, void *load_sp) __attribute__((visibility("hidden")));
__asm__(".text\n"
        ".globl kl_emu_switch\n"
        ".hidden kl_emu_switch\n"
        ".type kl_emu_switch,@function\n"
        "kl_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size kl_emu_switch, .-kl_emu_switch\n");

/* A fresh stack laid out as kl_emu_switch leaves one, whose `ret` enters
 * `entry` as if called (rsp = 8 mod 16), with a zero return address above
 * so that debuggers' backtraces stop there.  entry must never return. */
static void ctx_make(kl_ctx *c, void *lo, size_t size, void (*entry)(void)) {
  uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
  uint64_t *sp = (uint64_t *)top;
  *--sp = 0;                      /* fake return address of entry */
  *--sp = (uint64_t)(uintptr_t)entry;
  for (int i = 0; i < 6; i++) *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
  uint32_t mxcsr;
  uint16_t fpucw;
  __asm__ volatile("stmxcsr %0; fnstcw %1" : "=m"(mxcsr), "=m"(fpucw));
  *--sp = (uint64_t)mxcsr | (uint64_t)fpucw << 32;
  c->sp = sp;
  c->stack_lo = lo;
  c->stack_size = size;
}

static void raw_switch(kl_ctx *from, kl_ctx *to) { kl_emu_switch(&from->sp, to->sp); }
#else
static void ctx_make(kl_ctx *c, void *lo, size_t size, void (*entry)(void)) {
  if (getcontext(&c->uc) != 0) {
    perror("kiln emu: getcontext");
    abort();
  }
  c->uc.uc_stack.ss_sp = lo;
  c->uc.uc_stack.ss_size = size;
  c->uc.uc_link = NULL;
  makecontext(&c->uc, entry, 0);
  c->stack_lo = lo;
  c->stack_size = size;
}

static void raw_switch(kl_ctx *from, kl_ctx *to) { swapcontext(&from->uc, &to->uc); }
#endif

/* ---- workers and their state ---------------------------------------------------- */
enum { F_UNSTARTED, F_RUNNABLE, F_BAR, F_WARP, F_DONE };

/* One CUDA thread of the block in fiber mode. */
typedef struct fiber {
  kl_ctx ctx;
  kl_dim3 tid;
  unsigned char state;
  /* while at a warp collective: what it asked; `out` is its result */
  unsigned char op;
  unsigned char width;
  int arg;
  unsigned mask;
  uint64_t val, out;
  /* the block barrier round it was released from: predicates counted and
   * threads that arrived, for __syncthreads_count/_and/_or */
  unsigned bar_count, bar_total;
} fiber;

typedef struct warp {
  unsigned live;    /* lanes that exist and have not exited */
  unsigned arrived; /* lanes waiting at a collective */
  unsigned want;    /* union of the waiting lanes' masks */
} warp;

/* A buffer for KL_SHARED arrays that did not fit in the arena. */
typedef struct overflow {
  struct overflow *next;
  max_align_t data[];
} overflow;

#define MAX_WARPS (KL_EMU_MAX_BLOCK_THREADS / 32)
/* Dynamic + static shared memory, with room for the redzones. */
#define ARENA_SIZE (KL_EMU_MAX_DYN_SHARED + KL_EMU_MAX_STATIC_SHARED + 64 * 1024)
#define REDZONE 32 /* bytes between KL_SHARED arrays (ASan catches overruns) */

typedef struct kl_emu_worker {
  int index;
  pthread_t thread;
  unsigned long long seen_gen;

  /* the launch */
  const kl_emu_kernel *k;
  void **args;

  /* the block being run */
  unsigned nthreads, ndone, cur;
  unsigned bar_arrived, bar_count;
  bool fiber_mode;
  fiber *fib;   /* [KL_EMU_MAX_BLOCK_THREADS] */
  warp warps[MAX_WARPS];
  kl_ctx exit_ctx; /* the block loop, waiting for fibers to finish */

  /* fiber stacks: KL_EMU_MAX_BLOCK_THREADS slots of stride bytes, a guard
   * page at the bottom of each; mapped once, guarded when first used */
  char *stacks;
  size_t page, stack_size, stride;
  unsigned char guarded[KL_EMU_MAX_BLOCK_THREADS];
#if KL_TSAN
  void *tsan_fibers[KL_EMU_MAX_BLOCK_THREADS]; /* one per stack slot */
#endif

  /* shared memory: [dynamic][redzone][KL_SHARED arrays ...] */
  unsigned char *arena;
  size_t arena_top, static_used, dyn_size;
  overflow *overflows;

  /* per-launch error (first one wins) and counters */
  bool failed;
  char err[512];
  unsigned long long blocks, fiber_blocks, switches;
#if KL_ASAN
  kl_ctx *asan_from; /* the context being left, to record its stack */
#endif
} worker;

/* block_epoch starts at 1 so that no KL_SHARED site (epoch 0) looks valid
 * before this thread's first block. */
_Thread_local kl_emu_state kl_emu_tls = {.block_epoch = 1};

static void fail(worker *w, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(worker *w, const char *fmt, ...) {
  if (w->failed) return;
  w->failed = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(w->err, sizeof w->err, fmt, ap);
  va_end(ap);
}

/* A kernel intrinsic outside kl_emu_launch is a bug in the caller, not an
 * input error: say so and stop. */
static worker *current(const char *what) {
  worker *w = kl_emu_tls.worker;
  if (!w) {
    fprintf(stderr, "kiln emu: %s called outside a kernel launch\n", what);
    abort();
  }
  return w;
}

/* ---- switching between fibers ------------------------------------------------------ */
#if KL_ASAN
static void asan_arrived(worker *w, void *fake) {
  const void *lo;
  size_t size;
  __sanitizer_finish_switch_fiber(fake, &lo, &size);
  w->asan_from->stack_lo = lo;
  w->asan_from->stack_size = size;
}
#endif

/* Leave `from` for `to`; returns when something switches back to `from`.
 * `dying`: from will never be resumed (lets ASan drop its fake stack). */
static void ctx_switch(worker *w, kl_ctx *from, kl_ctx *to, bool dying) {
  w->switches++;
#if KL_TSAN
  from->tsan_fiber = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(to->tsan_fiber, 0);
#endif
#if KL_ASAN
  void *fake = NULL;
  w->asan_from = from;
  __sanitizer_start_switch_fiber(dying ? NULL : &fake, to->stack_lo, to->stack_size);
  raw_switch(from, to);
  asan_arrived(w, fake);
#else
  (void)dying;
  raw_switch(from, to);
#endif
}

static void fiber_main(void);

static char *stack_slot(worker *w, unsigned i) { return w->stacks + (size_t)i * w->stride; }

/* Make thread i's first context on stack slot i. */
static void fiber_start(worker *w, unsigned i) {
  char *slot = stack_slot(w, i);
  if (!w->guarded[i]) {
    /* Without the guard (too many mappings?) an overflow would corrupt the
     * neighbouring stack silently; carry on, it is only a safety net. */
    (void)mprotect(slot, w->page, PROT_NONE);
    w->guarded[i] = 1;
  }
  char *lo = slot + w->page;
#if KL_ASAN
  /* Frames that never returned on this stack (fiber_main's) left poison. */
  ASAN_UNPOISON_MEMORY_REGION(lo, w->stack_size);
#endif
  ctx_make(&w->fib[i].ctx, lo, w->stack_size, fiber_main);
#if KL_TSAN
  if (!w->tsan_fibers[i]) w->tsan_fibers[i] = __tsan_create_fiber(0);
  w->fib[i].ctx.tsan_fiber = w->tsan_fibers[i];
#endif
  w->fib[i].state = F_RUNNABLE;
}

/* Run thread i from context `from` (starting it if new). */
static void resume(worker *w, kl_ctx *from, unsigned i, bool dying) {
  fiber *f = &w->fib[i];
  if (f->state == F_UNSTARTED) fiber_start(w, i);
  w->cur = i;
  kl_emu_tls.thread_idx = f->tid;
  ctx_switch(w, from, &f->ctx, dying);
}

/* ---- barriers ------------------------------------------------------------------------ */
static void bar_release(worker *w) {
  for (unsigned i = 0; i < w->nthreads; i++) {
    fiber *f = &w->fib[i];
    if (f->state != F_BAR) continue;
    f->state = F_RUNNABLE;
    f->bar_count = w->bar_count;
    f->bar_total = w->bar_arrived;
  }
  w->bar_arrived = w->bar_count = 0;
}

/* PTX shfl: which lane `lane` reads, or itself when the source falls outside
 * its segment (CUDA passes c = ((32 - width) << 8) | (up ? 0 : 31)). */
static unsigned shfl_source(int op, unsigned lane, int arg, unsigned width) {
  unsigned segmask = 32 - width, b = (unsigned)arg & 31u;
  unsigned min_lane = lane & segmask;
  unsigned max_lane = min_lane | ((op == KL_EMU_SHFL_UP ? 0u : 31u) & ~segmask);
  switch (op) {
  case KL_EMU_SHFL_UP:
    return (int)lane - (int)b >= (int)max_lane ? lane - b : lane;
  case KL_EMU_SHFL_DOWN:
    return lane + b <= max_lane ? lane + b : lane;
  case KL_EMU_SHFL_XOR:
    return (lane ^ b) <= max_lane ? lane ^ b : lane;
  default: /* IDX */
    return min_lane | (b & ~segmask);
  }
}

static bool warp_ready(const warp *wp) {
  return wp->arrived && (wp->want & wp->live & ~wp->arrived) == 0;
}

/* The last lane has arrived: compute every waiting lane's result. */
static void warp_release(worker *w, unsigned wi) {
  warp *wp = &w->warps[wi];
  fiber *lanes = &w->fib[wi * 32];
  unsigned arrived = wp->arrived, votes = 0;
  for (unsigned l = 0; l < 32; l++)
    if ((arrived >> l & 1) && lanes[l].val) votes |= 1u << l;
  for (unsigned l = 0; l < 32; l++) {
    if (!(arrived >> l & 1)) continue;
    fiber *f = &lanes[l];
    unsigned src;
    switch (f->op) {
    case KL_EMU_VOTE_BALLOT: f->out = votes & f->mask; break;
    case KL_EMU_VOTE_ANY: f->out = (votes & f->mask) != 0; break;
    case KL_EMU_VOTE_ALL: f->out = (votes & f->mask) == (arrived & f->mask); break;
    case KL_EMU_WARP_SYNC: f->out = 0; break;
    default:
      src = shfl_source(f->op, l, f->arg, f->width);
      f->out = (arrived >> src & 1) ? lanes[src].val : f->val;
    }
    f->state = F_RUNNABLE;
  }
  wp->arrived = wp->want = 0;
}

/* Thread i ran to its end: it no longer holds up barriers. */
static void thread_done(worker *w, unsigned i) {
  w->fib[i].state = F_DONE;
  w->ndone++;
  warp *wp = &w->warps[i / 32];
  wp->live &= ~(1u << (i % 32));
  if (warp_ready(wp)) warp_release(w, i / 32);
  if (w->bar_arrived && w->bar_arrived + w->ndone == w->nthreads) bar_release(w);
}

/* Nothing can run and not all are done: divergent barriers.  Report it and
 * release everyone, so the launch ends (with results not to be trusted). */
static void break_deadlock(worker *w) {
  unsigned at_bar = 0, at_warp = 0;
  for (unsigned i = 0; i < w->nthreads; i++) {
    at_bar += w->fib[i].state == F_BAR;
    at_warp += w->fib[i].state == F_WARP;
  }
  fail(w, "kernel %s, block (%u,%u,%u): deadlock: %u threads wait at __syncthreads, "
       "%u at warp collectives that cannot complete (divergent barrier?)",
       w->k->name, kl_emu_tls.block_idx.x, kl_emu_tls.block_idx.y, kl_emu_tls.block_idx.z,
       at_bar, at_warp);
  for (unsigned wi = 0; wi * 32 < w->nthreads; wi++)
    if (w->warps[wi].arrived) warp_release(w, wi); /* absent lanes read themselves */
  if (w->bar_arrived) bar_release(w);
}

/* The next thread to run after `self`, round robin; -1 when all are done. */
static int pick_next(worker *w, unsigned self) {
  unsigned n = w->nthreads;
  for (;;) {
    for (unsigned k = 1; k <= n; k++) {
      unsigned i = (self + k) % n;
      unsigned char st = w->fib[i].state;
      if (st == F_RUNNABLE || st == F_UNSTARTED) return (int)i;
    }
    if (w->ndone == n) return -1;
    break_deadlock(w);
  }
}

/* The current thread waits (its state is already F_BAR or F_WARP). */
static void wait_here(worker *w) {
  unsigned self = w->cur;
  int next = pick_next(w, self); /* never -1: self is not done */
  if ((unsigned)next != self) resume(w, &w->fib[self].ctx, (unsigned)next, false);
}

/* A fiber's first and only frame. */
static void fiber_main(void) {
  worker *w = kl_emu_tls.worker;
#if KL_ASAN
  asan_arrived(w, NULL);
#endif
  w->k->fn(w->args);
  unsigned self = w->cur;
  thread_done(w, self);
  int next = pick_next(w, self);
  if (next < 0)
    ctx_switch(w, &w->fib[self].ctx, &w->exit_ctx, true);
  else
    resume(w, &w->fib[self].ctx, (unsigned)next, true);
  fprintf(stderr, "kiln emu: a finished fiber was resumed\n");
  abort();
}

/* CUDA numbers a block's threads x fastest; warps are runs of 32. */
static kl_dim3 thread_of(unsigned linear) {
  kl_dim3 bd = kl_emu_tls.block_dim, t;
  t.x = linear % bd.x;
  t.y = linear / bd.x % bd.y;
  t.z = linear / (bd.x * bd.y);
  return t;
}

/* The running thread (cur) is the first to wait in this block: every thread
 * before it has finished, so it and those after it become fibers. */
static void enter_fiber_mode(worker *w) {
  unsigned t = w->cur, n = w->nthreads;
  w->fiber_mode = true;
  w->fiber_blocks++;
  w->ndone = t;
  w->bar_arrived = w->bar_count = 0;
  for (unsigned i = 0; i < n; i++) {
    w->fib[i].tid = thread_of(i);
    w->fib[i].state = i < t ? F_DONE : i == t ? F_RUNNABLE : F_UNSTARTED;
  }
  for (unsigned wi = 0; wi * 32 < n; wi++) {
    unsigned lanes = n - wi * 32 >= 32 ? 0xffffffffu : (1u << (n - wi * 32)) - 1;
    unsigned gone = t <= wi * 32 ? 0 : t >= wi * 32 + 32 ? 0xffffffffu : (1u << (t - wi * 32)) - 1;
    w->warps[wi] = (warp){.live = lanes & ~gone};
  }
}

int kl_emu_bar(int op, int pred) {
  worker *w = current("__syncthreads");
  if (!w->fiber_mode) enter_fiber_mode(w);
  fiber *f = &w->fib[w->cur];
  f->state = F_BAR;
  w->bar_arrived++;
  w->bar_count += pred != 0;
  if (w->bar_arrived + w->ndone == w->nthreads)
    bar_release(w);
  else
    wait_here(w);
  switch (op) {
  case KL_EMU_BAR_COUNT: return (int)f->bar_count;
  case KL_EMU_BAR_AND: return f->bar_count == f->bar_total;
  case KL_EMU_BAR_OR: return f->bar_count != 0;
  default: return 0;
  }
}

uint64_t kl_emu_warp(int op, unsigned mask, uint64_t val, int arg, int width) {
  worker *w = current("a warp collective");
  if (!w->fiber_mode) enter_fiber_mode(w);
  unsigned i = w->cur, wi = i / 32;
  fiber *f = &w->fib[i];
  if (width < 1 || width > 32 || (width & (width - 1))) {
    fail(w, "kernel %s: shuffle width %d is not a power of two <= 32", w->k->name, width);
    width = 32;
  }
  f->op = (unsigned char)op;
  f->width = (unsigned char)width;
  f->arg = arg;
  f->mask = mask;
  f->val = val;
  f->state = F_WARP;
  warp *wp = &w->warps[wi];
  wp->arrived |= 1u << (i % 32);
  wp->want |= mask | 1u << (i % 32);
  if (warp_ready(wp))
    warp_release(w, wi);
  else
    wait_here(w);
  return f->out;
}

/* ---- shared memory ----------------------------------------------------------------- */
static size_t align16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Every block's shared memory starts as 0xFF bytes (and, under ASan,
 * poisoned outside what the block was given). */
static void shared_begin_block(worker *w) {
  while (w->overflows) {
    overflow *o = w->overflows;
    w->overflows = o->next;
    free(o);
  }
#if KL_ASAN /* the arena starts poisoned; re-poison what the last block used */
  ASAN_POISON_MEMORY_REGION(w->arena, w->arena_top);
  ASAN_UNPOISON_MEMORY_REGION(w->arena, w->dyn_size);
#endif
  memset(w->arena, 0xff, w->dyn_size);
  w->arena_top = align16(w->dyn_size) + REDZONE;
  w->static_used = 0;
}

void *kl_emu_shared_alloc(kl_emu_site *site, size_t size) {
  worker *w = current("KL_SHARED");
  w->static_used += size;
  if (w->static_used > KL_EMU_MAX_STATIC_SHARED)
    fail(w, "kernel %s: KL_SHARED arrays need %zu bytes per block, more than %u",
         w->k->name, w->static_used, KL_EMU_MAX_STATIC_SHARED);
  void *p;
  size_t at = align16(w->arena_top);
  if (at + size + REDZONE <= ARENA_SIZE) {
    p = w->arena + at;
    w->arena_top = at + size + REDZONE;
#if KL_ASAN
    ASAN_UNPOISON_MEMORY_REGION(p, size);
#endif
  } else { /* over the limit (reported); keep the kernel's memory valid */
    overflow *o = malloc(sizeof *o + size);
    if (!o) {
      fprintf(stderr, "kiln emu: out of memory for shared memory\n");
      abort();
    }
    o->next = w->overflows;
    w->overflows = o;
    p = o->data;
  }
  memset(p, 0xff, size);
  site->ptr = p;
  site->epoch = kl_emu_tls.block_epoch;
  return p;
}

/* ---- running blocks ---------------------------------------------------------------- */
static void run_block(worker *w, unsigned long long b) {
  kl_dim3 gd = kl_emu_tls.grid_dim, bd = kl_emu_tls.block_dim;
  kl_emu_tls.block_idx.x = (unsigned)(b % gd.x);
  kl_emu_tls.block_idx.y = (unsigned)(b / gd.x % gd.y);
  kl_emu_tls.block_idx.z = (unsigned)(b / gd.x / gd.y);
  kl_emu_tls.block_epoch++;
  shared_begin_block(w);
  w->fiber_mode = false;
  w->blocks++;
  unsigned t = 0;
  for (unsigned z = 0; z < bd.z; z++)
    for (unsigned y = 0; y < bd.y; y++)
      for (unsigned x = 0; x < bd.x; x++, t++) {
        w->cur = t;
        kl_emu_tls.thread_idx = (kl_dim3){x, y, z};
        w->k->fn(w->args);
        if (w->fiber_mode) goto fibers;
      }
  return;
fibers:
  /* Thread t, which switched the block to fibers, has now finished here on
   * the worker's own stack; run the others until all are done. */
  thread_done(w, t);
  int next = pick_next(w, t);
  if (next >= 0) resume(w, &w->exit_ctx, (unsigned)next, false);
}

/* Allocate what a worker needs before its first block. */
static int worker_prepare(worker *w, char *err, size_t errlen) {
  if (!w->fib) w->fib = calloc(KL_EMU_MAX_BLOCK_THREADS, sizeof *w->fib);
  if (!w->arena) {
    w->arena = aligned_alloc(64, ARENA_SIZE);
#if KL_ASAN
    if (w->arena) ASAN_POISON_MEMORY_REGION(w->arena, ARENA_SIZE);
#endif
  }
  if (!w->stacks) {
    w->page = (size_t)sysconf(_SC_PAGESIZE);
    const char *kb = getenv("KL_EMU_STACK_KB");
    size_t size = kb && atoi(kb) >= 16 ? (size_t)atoi(kb) * 1024 : 64 * 1024;
    w->stack_size = (size + w->page - 1) / w->page * w->page;
    w->stride = w->stack_size + w->page;
    void *m = mmap(NULL, w->stride * KL_EMU_MAX_BLOCK_THREADS, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    w->stacks = m == MAP_FAILED ? NULL : m;
  }
  if (!w->fib || !w->arena || !w->stacks) {
    snprintf(err, errlen, "kiln emu: out of memory for a worker");
    return -1;
  }
  return 0;
}

/* ---- the pool ------------------------------------------------------------------------ */
static struct {
  pthread_mutex_t launch_lock; /* one launch at a time */
  pthread_mutex_t mu;
  pthread_cond_t wake, done;
  int want_threads;  /* kl_emu_set_threads; 0 = default */
  int nworkers;      /* workers[0] is whoever launches */
  worker **workers;
  unsigned long long gen; /* bumped per launch that uses helpers */
  int helpers, running;
  bool stop;
  /* the launch */
  const kl_emu_kernel *k;
  void **args;
  kl_dim3 grid, block;
  size_t dyn;
  unsigned long long nblocks, next_block;
  kl_emu_stats stats;
} pool = {.launch_lock = PTHREAD_MUTEX_INITIALIZER,
          .mu = PTHREAD_MUTEX_INITIALIZER,
          .wake = PTHREAD_COND_INITIALIZER,
          .done = PTHREAD_COND_INITIALIZER};

static void run_blocks(worker *w) {
  kl_emu_tls.worker = w;
  kl_emu_tls.grid_dim = pool.grid;
  kl_emu_tls.block_dim = pool.block;
  kl_emu_tls.dyn_shared = w->arena;
  w->k = pool.k;
  w->args = pool.args;
  w->nthreads = pool.block.x * pool.block.y * pool.block.z;
  w->dyn_size = pool.dyn;
  unsigned long long b;
  while ((b = __atomic_fetch_add(&pool.next_block, 1, __ATOMIC_RELAXED)) < pool.nblocks)
    run_block(w, b);
  kl_emu_tls.worker = NULL;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  pthread_mutex_lock(&pool.mu);
  for (;;) {
    while (w->seen_gen == pool.gen && !pool.stop) pthread_cond_wait(&pool.wake, &pool.mu);
    if (pool.stop) break;
    w->seen_gen = pool.gen;
    if (w->index > pool.helpers) continue; /* not needed this time */
    pthread_mutex_unlock(&pool.mu);
    run_blocks(w);
    pthread_mutex_lock(&pool.mu);
    if (--pool.running == 0) pthread_cond_signal(&pool.done);
  }
  pthread_mutex_unlock(&pool.mu);
  return NULL;
}

static int default_threads(void) {
  const char *env = getenv("KL_EMU_THREADS");
  if (env && atoi(env) > 0) return atoi(env);
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

static void free_worker(worker *w) {
#if KL_TSAN
  for (int i = 0; i < KL_EMU_MAX_BLOCK_THREADS; i++)
    if (w->tsan_fibers[i]) __tsan_destroy_fiber(w->tsan_fibers[i]);
#endif
  if (w->stacks) munmap(w->stacks, w->stride * KL_EMU_MAX_BLOCK_THREADS);
  while (w->overflows) {
    overflow *o = w->overflows;
    w->overflows = o->next;
    free(o);
  }
#if KL_ASAN
  if (w->arena) ASAN_UNPOISON_MEMORY_REGION(w->arena, ARENA_SIZE);
#endif
  free(w->arena);
  free(w->fib);
  free(w);
}

static void pool_stop(void) {
  pthread_mutex_lock(&pool.mu);
  pool.stop = true;
  pthread_cond_broadcast(&pool.wake);
  pthread_mutex_unlock(&pool.mu);
  for (int i = 1; i < pool.nworkers; i++) pthread_join(pool.workers[i]->thread, NULL);
  for (int i = 0; i < pool.nworkers; i++) free_worker(pool.workers[i]);
  free(pool.workers);
  pool.workers = NULL;
  pool.nworkers = 0;
  pool.stop = false;
}

/* Start the pool; a worker whose thread cannot start is simply not used. */
static int pool_start(char *err, size_t errlen) {
  int n = pool.want_threads > 0 ? pool.want_threads : default_threads();
  pool.workers = calloc((size_t)n, sizeof *pool.workers);
  if (!pool.workers) goto oom;
  for (int i = 0; i < n; i++) {
    worker *w = calloc(1, sizeof *w);
    if (!w) goto oom;
    w->index = i;
    w->seen_gen = pool.gen;
    if (i > 0 && pthread_create(&w->thread, NULL, worker_main, w) != 0) {
      free(w);
      break;
    }
    pool.workers[pool.nworkers++] = w;
  }
  return 0;
oom:
  snprintf(err, errlen, "kiln emu: out of memory starting the worker pool");
  if (pool.workers) pool_stop();
  return -1;
}

int kl_emu_threads(void) {
  pthread_mutex_lock(&pool.launch_lock);
  int n = pool.want_threads > 0 ? pool.want_threads : default_threads();
  pthread_mutex_unlock(&pool.launch_lock);
  return n;
}

void kl_emu_set_threads(int n) {
  pthread_mutex_lock(&pool.launch_lock);
  if (pool.nworkers) pool_stop();
  pool.want_threads = n > 0 ? n : 0;
  pthread_mutex_unlock(&pool.launch_lock);
}

void kl_emu_shutdown(void) {
  pthread_mutex_lock(&pool.launch_lock);
  if (pool.nworkers) pool_stop();
  pthread_mutex_unlock(&pool.launch_lock);
}

void kl_emu_get_stats(kl_emu_stats *s) {
  pthread_mutex_lock(&pool.launch_lock);
  *s = pool.stats;
  pthread_mutex_unlock(&pool.launch_lock);
}

/* ---- launch ------------------------------------------------------------------------------ */
static int check_config(const kl_emu_kernel *k, kl_dim3 g, kl_dim3 b, size_t dyn,
                        char *err, size_t errlen) {
  const char *name = k && k->name ? k->name : "?";
  unsigned long long threads = (unsigned long long)b.x * b.y * b.z;
  if (!k || !k->fn)
    snprintf(err, errlen, "kiln emu: launch of kernel %s without an entry", name);
  else if (!g.x || !g.y || !g.z || !b.x || !b.y || !b.z)
    snprintf(err, errlen, "kernel %s: grid (%u,%u,%u) or block (%u,%u,%u) has a zero dimension",
             name, g.x, g.y, g.z, b.x, b.y, b.z);
  else if (threads > KL_EMU_MAX_BLOCK_THREADS || b.x > 1024 || b.y > 1024 || b.z > 64)
    snprintf(err, errlen, "kernel %s: block (%u,%u,%u) = %llu threads; the limit is %d "
             "(and x,y <= 1024, z <= 64)", name, b.x, b.y, b.z, threads,
             KL_EMU_MAX_BLOCK_THREADS);
  else if (g.x > 2147483647u || g.y > 65535 || g.z > 65535)
    snprintf(err, errlen, "kernel %s: grid (%u,%u,%u) exceeds (2^31-1, 65535, 65535)",
             name, g.x, g.y, g.z);
  else if (dyn > KL_EMU_MAX_DYN_SHARED)
    snprintf(err, errlen, "kernel %s: %zu bytes of dynamic shared memory, more than %u",
             name, dyn, KL_EMU_MAX_DYN_SHARED);
  else
    return 0;
  return -1;
}

int kl_emu_launch(const kl_emu_kernel *k, kl_dim3 grid, kl_dim3 block, size_t dyn_shared,
                  void **args, char *err, size_t errlen) {
  char scratch[8];
  if (!err || !errlen) {
    err = scratch;
    errlen = sizeof scratch;
  }
  err[0] = '\0';
  if (check_config(k, grid, block, dyn_shared, err, errlen)) return -1;
  if (kl_emu_tls.worker) {
    snprintf(err, errlen, "kernel %s: launched from inside a kernel", k->name);
    return -1;
  }
  pthread_mutex_lock(&pool.launch_lock);
  int rc = pool.nworkers ? 0 : pool_start(err, errlen);
  if (rc) goto out;
  pool.k = k;
  pool.args = args;
  pool.grid = grid;
  pool.block = block;
  pool.dyn = dyn_shared;
  pool.nblocks = (unsigned long long)grid.x * grid.y * grid.z;
  pool.next_block = 0;
  int helpers = pool.nblocks - 1 < (unsigned long long)pool.nworkers - 1
                    ? (int)(pool.nblocks - 1) : pool.nworkers - 1;
  for (int i = 0; i <= helpers && rc == 0; i++) rc = worker_prepare(pool.workers[i], err, errlen);
  if (rc) goto out;
  if (helpers > 0) {
    pthread_mutex_lock(&pool.mu);
    pool.helpers = helpers;
    pool.running = helpers;
    pool.gen++;
    pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.mu);
  }
  run_blocks(pool.workers[0]);
  if (helpers > 0) {
    pthread_mutex_lock(&pool.mu);
    while (pool.running) pthread_cond_wait(&pool.done, &pool.mu);
    pthread_mutex_unlock(&pool.mu);
  }
  pool.stats.launches++;
  for (int i = 0; i <= helpers; i++) {
    worker *w = pool.workers[i];
    if (w->failed && rc == 0) {
      snprintf(err, errlen, "%s", w->err);
      rc = -1;
    }
    w->failed = false;
    pool.stats.blocks += w->blocks;
    pool.stats.fiber_blocks += w->fiber_blocks;
    pool.stats.switches += w->switches;
    w->blocks = w->fiber_blocks = w->switches = 0;
  }
out:
  pthread_mutex_unlock(&pool.launch_lock);
  return rc;
}
