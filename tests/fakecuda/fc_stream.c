/*
 * fakecuda streams and events. Streams and events belong to the context
 * current when they were made (a device's primary context, usually): each
 * context has its own legacy default stream, each thread its own per-thread
 * default stream in each context, and an event is recorded only on a stream
 * of its own context, as on CUDA. Each stream owns a worker thread
 * that runs its queue in order, sleeping the configured delay before each copy,
 * memset and host function, so work issued on a stream completes later, as on
 * a GPU. Events keep their state (records issued, records completed) in a
 * memfd page when they are interprocess, so an importer in another process
 * observes completion and its stream workers can wait for it.
 *
 * Ownership: a stream is freed when its creator destroyed it, its worker
 * drained the queue and no queued operation of another stream depends on it
 * (refcount). An event is freed when destroyed and no queued record or wait
 * names it. Any thread may call the API functions.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fc_internal.h"

enum fc_stream_role {
    FC_S_USER,
    FC_S_LEGACY,
    FC_S_PER_THREAD,
};

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* queue got an op, or closing */
    pthread_cond_t done_cv; /* completed advanced */
    struct fc_op *head, *tail; /* head is the op running or next to run */
    uint64_t issued, completed;
    unsigned flags;
    enum fc_stream_role role;
    struct CUctx_st *ctx;
    bool closing;
    _Atomic int refs;
    struct CUstream_st *all_next, *all_prev; /* g_fc.streams */
};

struct CUevent_st {
    unsigned flags;
    bool imported;
    bool counted_ipc;     /* counts in live_ipc_events */
    struct CUctx_st *ctx; /* current at its creation (or opening) */
    _Atomic int refs;
    struct fc_ev_shared *sh;
    size_t map_len; /* sh is mmapped when > 0, else heap */
    int fd;         /* exporter's memfd while exportable, else -1 */
};

/* ---- handle registries: validate handles, trap on use after destroy ------- */

struct fc_reg {
    void **live;
    size_t n, cap;
    void *dead[FC_DEAD_RING];
    size_t dead_next;
};

static struct fc_reg reg_streams, reg_events;

/* All fc_reg_* run under g_fc.mu. */
static int fc_reg_add(struct fc_reg *r, void *p)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 32;
        void **live = realloc(r->live, cap * sizeof(*live));
        if (!live)
            return -ENOMEM;
        r->live = live;
        r->cap = cap;
    }
    r->live[r->n++] = p;
    for (size_t i = 0; i < FC_DEAD_RING; i++)
        if (r->dead[i] == p)
            r->dead[i] = NULL; /* the allocator reused the address */
    return 0;
}

static bool fc_reg_has(const struct fc_reg *r, const void *p)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->live[i] == p)
            return true;
    return false;
}

static bool fc_reg_was_dead(const struct fc_reg *r, const void *p)
{
    for (size_t i = 0; i < FC_DEAD_RING; i++)
        if (p && r->dead[i] == p)
            return true;
    return false;
}

static void fc_reg_kill(struct fc_reg *r, void *p)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->live[i] == p) {
            r->live[i] = r->live[--r->n];
            break;
        }
    }
    r->dead[r->dead_next] = p;
    r->dead_next = (r->dead_next + 1) % FC_DEAD_RING;
}

/* ---- operations ----------------------------------------------------------- */

struct fc_op *fc_op_new(enum fc_op_kind kind)
{
    struct fc_op *op = calloc(1, sizeof(*op));
    if (op)
        op->kind = kind;
    return op;
}

static void fc_event_put(struct CUevent_st *ev);

/* Drops the op's hold on the memory it touched. Runs before the op counts as
 * completed, so whoever waited for the stream finds the memory idle. */
static void fc_op_untouch(struct fc_op *op)
{
    for (int i = 0; i < 2; i++) {
        if (op->touch[i])
            atomic_fetch_sub(&op->touch[i]->pending, 1);
        op->touch[i] = NULL;
    }
}

static void fc_op_free(struct fc_op *op)
{
    fc_op_untouch(op);
    switch (op->kind) {
    case FC_OP_COPY:
        free(op->u.copy.staging);
        break;
    case FC_OP_RECORD:
    case FC_OP_WAIT_EVENT:
        fc_event_put(op->u.ev.ev);
        break;
    case FC_OP_WAIT_STREAM:
        fc_stream_put(op->u.dep.s);
        break;
    default:
        break;
    }
    free(op);
}

static void fc_sleep_us(unsigned us)
{
    struct timespec ts = { .tv_sec = us / 1000000u, .tv_nsec = (long)(us % 1000000u) * 1000 };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static void fc_event_complete(struct fc_ev_shared *sh, uint64_t seq)
{
    uint64_t cur = atomic_load(&sh->completed);
    while (cur < seq && !atomic_compare_exchange_weak(&sh->completed, &cur, seq)) {
    }
    atomic_fetch_add(&sh->wake, 1);
    fc_futex_wake_all(&sh->wake);
}

/* Blocks until the event's record number target completed. A record whose
 * process died before its stream reached it never completes; rather than
 * hang a test forever the wait then ends with a warning. */
static void fc_event_wait_target(struct CUevent_st *ev, uint64_t target)
{
    struct fc_ev_shared *sh = ev->sh;
    pid_t self = getpid();
    for (unsigned round = 1;; round++) {
        uint32_t w = atomic_load(&sh->wake);
        if (atomic_load(&sh->completed) >= target)
            return;
        if (sh->interprocess && round % 8 == 0) {
            pid_t rp = atomic_load(&sh->recorder_pid);
            if (rp != self && !fc_pid_alive(rp)) {
                fc_warn("event %016" PRIx64 ": process %d died before its record "
                        "completed; treating the record as complete", sh->id, (int)rp);
                fc_event_complete(sh, target);
                return;
            }
        }
        fc_futex_wait(&sh->wake, w, 20 * 1000 * 1000L);
    }
}

static void fc_op_run(struct fc_op *op)
{
    if (op->delay_us)
        fc_sleep_us(op->delay_us);
    switch (op->kind) {
    case FC_OP_COPY:
        memmove(op->u.copy.dst, op->u.copy.staging ? op->u.copy.staging : op->u.copy.src,
                op->u.copy.n);
        break;
    case FC_OP_SET:
        memset(op->u.set.dst, op->u.set.value, op->u.set.n);
        break;
    case FC_OP_HOSTFN:
        op->u.host.fn(op->u.host.arg);
        break;
    case FC_OP_RECORD:
        fc_event_complete(op->u.ev.ev->sh, op->u.ev.target);
        break;
    case FC_OP_WAIT_EVENT:
        fc_event_wait_target(op->u.ev.ev, op->u.ev.target);
        break;
    case FC_OP_WAIT_STREAM:
        fc_stream_wait_seq(op->u.dep.s, op->u.dep.seq);
        break;
    case FC_OP_FREE:
        fc_pool_free_now(op->u.free.ptr);
        break;
    }
}

/* ---- streams ----------------------------------------------------------------- */

void fc_stream_put(struct CUstream_st *s)
{
    if (!s || atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work_cv);
    pthread_cond_destroy(&s->done_cv);
    free(s);
}

static void *fc_stream_worker(void *arg)
{
    struct CUstream_st *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->closing)
            pthread_cond_wait(&s->work_cv, &s->mu);
        if (!s->head)
            break;
        struct fc_op *op = s->head;
        pthread_mutex_unlock(&s->mu);
        fc_op_run(op);
        fc_op_untouch(op);
        pthread_mutex_lock(&s->mu);
        s->head = op->next;
        if (!s->head)
            s->tail = NULL;
        s->completed = op->seq;
        pthread_cond_broadcast(&s->done_cv);
        pthread_mutex_unlock(&s->mu);
        fc_op_free(op); /* may drop stream refs: never under a stream lock */
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&g_fc.mu);
    if (s->all_prev)
        s->all_prev->all_next = s->all_next;
    else
        g_fc.streams = s->all_next;
    if (s->all_next)
        s->all_next->all_prev = s->all_prev;
    pthread_mutex_unlock(&g_fc.mu);
    fc_stream_put(s);
    return NULL;
}

/* Returns a stream holding two references (its owner's and its worker's),
 * or NULL when out of memory or threads. */
static struct CUstream_st *fc_stream_new(unsigned flags, enum fc_stream_role role,
                                         struct CUctx_st *ctx)
{
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work_cv, NULL);
    pthread_cond_init(&s->done_cv, NULL);
    s->flags = flags;
    s->role = role;
    s->ctx = ctx;
    atomic_store(&s->refs, 2);

    pthread_mutex_lock(&g_fc.mu);
    s->all_next = g_fc.streams;
    if (g_fc.streams)
        g_fc.streams->all_prev = s;
    g_fc.streams = s;
    pthread_mutex_unlock(&g_fc.mu);

    /* Workers take no signals: tests' handlers run on their own threads. */
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pthread_t t;
    int rc = pthread_create(&t, &attr, fc_stream_worker, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&g_fc.mu);
        if (s->all_prev)
            s->all_prev->all_next = s->all_next;
        else
            g_fc.streams = s->all_next;
        if (s->all_next)
            s->all_next->all_prev = s->all_prev;
        pthread_mutex_unlock(&g_fc.mu);
        atomic_store(&s->refs, 1);
        fc_stream_put(s);
        return NULL;
    }
    return s;
}

/* Tells the worker to exit once drained and drops the owner's reference. */
static void fc_stream_close(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    s->closing = true;
    pthread_cond_broadcast(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    fc_stream_put(s);
}

CUcontext fc_stream_ctx(const struct CUstream_st *s)
{
    return s->ctx;
}

/* The legacy default stream of ctx, started on first use. Returns it with a
 * reference taken, or NULL when out of threads. */
static struct CUstream_st *fc_ctx_legacy_get(struct CUctx_st *ctx)
{
    pthread_mutex_lock(&g_fc.mu);
    struct CUstream_st *s = ctx->legacy;
    if (s)
        atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&g_fc.mu);
    if (s)
        return s;
    struct CUstream_st *n = fc_stream_new(0, FC_S_LEGACY, ctx);
    if (!n)
        return NULL;
    pthread_mutex_lock(&g_fc.mu);
    if (!ctx->legacy)
        ctx->legacy = n; /* the context keeps the owner's reference for life */
    s = ctx->legacy;     /* ...or another thread was first */
    atomic_fetch_add(&s->refs, 1);
    pthread_mutex_unlock(&g_fc.mu);
    if (s != n)
        fc_stream_close(n);
    return s;
}

/* This thread's per-thread default streams, one per context it used. */
struct fc_pts {
    size_t n, cap;
    struct CUstream_st **s;
};
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;
static _Thread_local struct fc_pts *tls_pts;

static void fc_per_thread_exit(void *p)
{
    struct fc_pts *t = p;
    for (size_t i = 0; i < t->n; i++)
        fc_stream_close(t->s[i]);
    free(t->s);
    free(t);
}

static void fc_per_thread_key(void)
{
    pthread_key_create(&per_thread_key, fc_per_thread_exit);
}

static struct CUstream_st *fc_per_thread_get(struct CUctx_st *ctx)
{
    if (!tls_pts) {
        pthread_once(&per_thread_once, fc_per_thread_key);
        tls_pts = calloc(1, sizeof(*tls_pts));
        if (!tls_pts)
            return NULL;
        pthread_setspecific(per_thread_key, tls_pts);
    }
    for (size_t i = 0; i < tls_pts->n; i++)
        if (tls_pts->s[i]->ctx == ctx)
            return tls_pts->s[i];
    if (tls_pts->n == tls_pts->cap) {
        size_t cap = tls_pts->cap ? tls_pts->cap * 2 : 4;
        struct CUstream_st **a = realloc(tls_pts->s, cap * sizeof(*a));
        if (!a)
            return NULL;
        tls_pts->s = a;
        tls_pts->cap = cap;
    }
    struct CUstream_st *s = fc_stream_new(0, FC_S_PER_THREAD, ctx);
    if (s)
        tls_pts->s[tls_pts->n++] = s;
    return s;
}

cudaError_t fc_stream_get(cudaStream_t h, struct CUstream_st **out)
{
    struct CUstream_st *s;
    if (h == NULL || h == cudaStreamLegacy) {
        struct CUctx_st *ctx = fc_ctx_current();
        if (!ctx)
            fc_trap("the legacy stream named with no current context (fakecuda bug)");
        s = fc_ctx_legacy_get(ctx);
        if (!s)
            return cudaErrorMemoryAllocation;
        *out = s;
        return cudaSuccess;
    } else if (h == cudaStreamPerThread) {
        struct CUctx_st *ctx = fc_ctx_current();
        if (!ctx)
            fc_trap("the per-thread stream named with no current context (fakecuda bug)");
        s = fc_per_thread_get(ctx);
        if (!s)
            return cudaErrorMemoryAllocation;
    } else {
        pthread_mutex_lock(&g_fc.mu);
        bool live = fc_reg_has(&reg_streams, h);
        bool dead = !live && fc_reg_was_dead(&reg_streams, h);
        if (live)
            atomic_fetch_add(&h->refs, 1);
        pthread_mutex_unlock(&g_fc.mu);
        if (dead)
            fc_trap("stream %p used after cudaStreamDestroy", (void *)h);
        if (!live)
            return cudaErrorInvalidResourceHandle;
        *out = h;
        return cudaSuccess;
    }
    atomic_fetch_add(&s->refs, 1);
    *out = s;
    return cudaSuccess;
}

static struct fc_op *fc_dep_on(struct CUstream_st *t, uint64_t seq)
{
    struct fc_op *d = fc_op_new(FC_OP_WAIT_STREAM);
    if (!d)
        fc_trap("out of memory queueing a stream dependency");
    atomic_fetch_add(&t->refs, 1);
    d->u.dep.s = t;
    d->u.dep.seq = seq;
    return d;
}

/* The legacy default stream of a context waits for all earlier work of
 * every blocking stream of that context, and a blocking stream waits for
 * earlier work of its context's legacy stream (cudaStreamNonBlocking
 * streams do neither; nothing crosses contexts). */
uint64_t fc_stream_submit(struct CUstream_st *s, struct fc_op *op)
{
    struct fc_op *deps = NULL, **dtail = &deps;
    if (s->role == FC_S_LEGACY) {
        pthread_mutex_lock(&g_fc.mu);
        for (struct CUstream_st *t = g_fc.streams; t; t = t->all_next) {
            if (t == s || t->ctx != s->ctx || (t->flags & cudaStreamNonBlocking))
                continue;
            pthread_mutex_lock(&t->mu);
            if (t->issued > t->completed) {
                *dtail = fc_dep_on(t, t->issued);
                dtail = &(*dtail)->next;
            }
            pthread_mutex_unlock(&t->mu);
        }
        pthread_mutex_unlock(&g_fc.mu);
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        pthread_mutex_lock(&g_fc.mu);
        struct CUstream_st *l = s->ctx->legacy;
        if (l)
            atomic_fetch_add(&l->refs, 1);
        pthread_mutex_unlock(&g_fc.mu);
        if (l) {
            pthread_mutex_lock(&l->mu);
            if (l->issued > l->completed) {
                *dtail = fc_dep_on(l, l->issued);
                dtail = &(*dtail)->next;
            }
            pthread_mutex_unlock(&l->mu);
            fc_stream_put(l);
        }
    }

    pthread_mutex_lock(&s->mu);
    if (s->closing)
        fc_trap("work queued on stream %p after cudaStreamDestroy", (void *)s);
    *dtail = op;
    op->next = NULL;
    for (struct fc_op *o = deps; o; o = o->next)
        o->seq = ++s->issued;
    if (s->tail)
        s->tail->next = deps;
    else
        s->head = deps;
    s->tail = op;
    uint64_t seq = op->seq;
    pthread_cond_signal(&s->work_cv);
    pthread_mutex_unlock(&s->mu);
    return seq;
}

void fc_stream_wait_seq(struct CUstream_st *s, uint64_t seq)
{
    pthread_mutex_lock(&s->mu);
    while (s->completed < seq)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void fc_stream_drain(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t seq = s->issued;
    while (s->completed < seq)
        pthread_cond_wait(&s->done_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

void fc_sync_all(CUcontext ctx)
{
    pthread_mutex_lock(&g_fc.mu);
    size_t n = 0;
    for (struct CUstream_st *t = g_fc.streams; t; t = t->all_next)
        n++;
    struct CUstream_st **all = calloc(n ? n : 1, sizeof(*all));
    if (!all)
        fc_trap("out of memory in a device synchronisation");
    n = 0;
    for (struct CUstream_st *t = g_fc.streams; t; t = t->all_next) {
        if (ctx && t->ctx != ctx)
            continue;
        atomic_fetch_add(&t->refs, 1);
        all[n++] = t;
    }
    pthread_mutex_unlock(&g_fc.mu);
    for (size_t i = 0; i < n; i++) {
        fc_stream_drain(all[i]);
        fc_stream_put(all[i]);
    }
    free(all);
}

FC_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *pStream, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!pStream || (flags & ~(unsigned)cudaStreamNonBlocking))
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUstream_st *s = fc_stream_new(flags, FC_S_USER, fc_ctx_current());
    if (!s)
        return fc_rt_err(cudaErrorMemoryAllocation);
    pthread_mutex_lock(&g_fc.mu);
    int rc = fc_reg_add(&reg_streams, s);
    pthread_mutex_unlock(&g_fc.mu);
    if (rc < 0) {
        fc_stream_close(s);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    FC_COUNT(live_streams);
    *pStream = s;
    return cudaSuccess;
}

FC_API cudaError_t cudaStreamCreate(cudaStream_t *pStream)
{
    return cudaStreamCreateWithFlags(pStream, cudaStreamDefault);
}

FC_API cudaError_t cudaStreamDestroy(cudaStream_t stream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (stream == NULL || stream == cudaStreamLegacy || stream == cudaStreamPerThread)
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_fc.mu);
    bool live = fc_reg_has(&reg_streams, stream);
    bool dead = !live && fc_reg_was_dead(&reg_streams, stream);
    if (live)
        fc_reg_kill(&reg_streams, stream);
    pthread_mutex_unlock(&g_fc.mu);
    if (dead)
        fc_trap("cudaStreamDestroy on stream %p, already destroyed", (void *)stream);
    if (!live)
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    FC_DROP(live_streams);
    /* Like CUDA: returns at once; queued work still runs to completion. */
    fc_stream_close(stream);
    return cudaSuccess;
}

FC_API cudaError_t cudaStreamSynchronize(cudaStream_t stream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    struct CUstream_st *s;
    if ((e = fc_stream_get(stream, &s)))
        return fc_rt_err(e);
    FC_COUNT(stream_sync_calls);
    fc_stream_drain(s);
    fc_stream_put(s);
    return cudaSuccess;
}

FC_API cudaError_t cudaStreamQuery(cudaStream_t stream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    struct CUstream_st *s;
    if ((e = fc_stream_get(stream, &s)))
        return fc_rt_err(e);
    pthread_mutex_lock(&s->mu);
    bool done = s->completed >= s->issued;
    pthread_mutex_unlock(&s->mu);
    fc_stream_put(s);
    return done ? cudaSuccess : cudaErrorNotReady;
}

FC_API cudaError_t cudaDeviceSynchronize(void)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    FC_COUNT(device_sync_calls);
    fc_sync_all(fc_ctx_current()); /* the current device's work only */
    return cudaSuccess;
}

FC_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void *userData)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!fn)
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUstream_st *s;
    if ((e = fc_stream_get(stream, &s)))
        return fc_rt_err(e);
    struct fc_op *op = fc_op_new(FC_OP_HOSTFN);
    if (!op) {
        fc_stream_put(s);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    op->delay_us = atomic_load(&g_set.delay_us);
    op->u.host.fn = fn;
    op->u.host.arg = userData;
    FC_COUNT(host_func_calls);
    fc_stream_submit(s, op);
    fc_stream_put(s);
    return cudaSuccess;
}

/* ---- events ------------------------------------------------------------------ */

static void fc_event_put(struct CUevent_st *ev)
{
    if (!ev || atomic_fetch_sub(&ev->refs, 1) != 1)
        return;
    if (ev->map_len)
        munmap(ev->sh, ev->map_len);
    else
        free(ev->sh);
    if (ev->fd >= 0)
        close(ev->fd);
    free(ev);
}

/* Takes a reference on a live event. Traps on a destroyed one. */
static cudaError_t fc_event_get(cudaEvent_t h, struct CUevent_st **out)
{
    if (!h)
        return cudaErrorInvalidResourceHandle;
    pthread_mutex_lock(&g_fc.mu);
    bool live = fc_reg_has(&reg_events, h);
    bool dead = !live && fc_reg_was_dead(&reg_events, h);
    if (live)
        atomic_fetch_add(&h->refs, 1);
    pthread_mutex_unlock(&g_fc.mu);
    if (dead)
        fc_trap("event %p used after cudaEventDestroy", (void *)h);
    if (!live)
        return cudaErrorInvalidResourceHandle;
    *out = h;
    return cudaSuccess;
}

/* CUDA: operations on an imported event after its exporter destroyed it, or
 * exited, are undefined behaviour. */
static void fc_event_check_exporter(struct CUevent_st *ev, const char *what)
{
    if (!ev->imported)
        return;
    if (atomic_load(&ev->sh->owner_destroyed))
        fc_trap("%s on an imported event whose exporter (pid %d) destroyed it",
                what, (int)ev->sh->owner_pid);
    if (!fc_pid_alive(ev->sh->owner_pid))
        fc_trap("%s on an imported event whose exporter (pid %d) exited",
                what, (int)ev->sh->owner_pid);
}

static cudaError_t fc_event_register(struct CUevent_st *ev)
{
    pthread_mutex_lock(&g_fc.mu);
    int rc = fc_reg_add(&reg_events, ev);
    pthread_mutex_unlock(&g_fc.mu);
    if (rc < 0)
        return cudaErrorMemoryAllocation;
    FC_COUNT(live_events);
    return cudaSuccess;
}

FC_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    const unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
    if (!event || (flags & ~known))
        return fc_rt_err(cudaErrorInvalidValue);
    /* CUDA: cudaEventInterprocess must be given with cudaEventDisableTiming. */
    if ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))
        return fc_rt_err(cudaErrorInvalidValue);

    /* Interprocess events are a scarcer resource than plain ones: the fake
     * caps how many may live (the real limit is not documented). */
    long cap = fc_ipc_event_limit();
    if ((flags & cudaEventInterprocess) &&
        atomic_fetch_add(&g_cnt.live_ipc_events, 1) >= cap && cap > 0) {
        FC_DROP(live_ipc_events);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        if (flags & cudaEventInterprocess)
            FC_DROP(live_ipc_events);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    ev->flags = flags;
    ev->fd = -1;
    ev->ctx = fc_ctx_current();
    atomic_store(&ev->refs, 1);
    if (flags & cudaEventInterprocess) {
        int fd = fc_memfd_new("fakecuda-event", 0);
        if (fd < 0) {
            free(ev);
            FC_DROP(live_ipc_events);
            return fc_rt_err(cudaErrorMemoryAllocation);
        }
        size_t len = fc_page_size();
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            free(ev);
            FC_DROP(live_ipc_events);
            return fc_rt_err(cudaErrorMemoryAllocation);
        }
        ev->fd = fd;
        ev->sh = p;
        ev->map_len = len;
    } else {
        ev->sh = calloc(1, sizeof(*ev->sh));
        if (!ev->sh) {
            free(ev);
            return fc_rt_err(cudaErrorMemoryAllocation);
        }
    }
    ev->counted_ipc = (flags & cudaEventInterprocess) != 0;
    ev->sh->magic = FC_EV_MAGIC;
    ev->sh->interprocess = (flags & cudaEventInterprocess) != 0;
    ev->sh->id = fc_new_id();
    ev->sh->owner_pid = getpid();
    if ((e = fc_event_register(ev))) {
        if (ev->counted_ipc)
            FC_DROP(live_ipc_events);
        fc_event_put(ev);
        return fc_rt_err(e);
    }
    *event = ev;
    return cudaSuccess;
}

FC_API cudaError_t cudaEventCreate(cudaEvent_t *event)
{
    return cudaEventCreateWithFlags(event, cudaEventDefault);
}

FC_API cudaError_t cudaEventDestroy(cudaEvent_t event)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    unsigned slow = atomic_load(&g_set.destroy_delay_us);
    if (slow) /* a test widening a window around the call */
        usleep(slow);
    if (!event)
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&g_fc.mu);
    bool live = fc_reg_has(&reg_events, event);
    bool dead = !live && fc_reg_was_dead(&reg_events, event);
    if (live)
        fc_reg_kill(&reg_events, event);
    pthread_mutex_unlock(&g_fc.mu);
    if (dead)
        fc_trap("cudaEventDestroy on event %p, already destroyed", (void *)event);
    if (!live)
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    if (event->imported) {
        fc_peers_leave(&event->sh->importers, getpid());
        FC_DROP(ipc_events_open_now);
    } else if (event->sh->interprocess) {
        /* Importers keep the page mapped and see that it is gone; new opens
         * fail because the memfd is closed. */
        atomic_store(&event->sh->owner_destroyed, 1);
        close(event->fd);
        event->fd = -1;
    }
    if (event->counted_ipc)
        FC_DROP(live_ipc_events);
    FC_DROP(live_events);
    fc_event_put(event); /* queued records and waits hold their own refs */
    return cudaSuccess;
}

static int fc_event_other_holders(struct CUevent_st *ev)
{
    pid_t self = getpid();
    struct fc_ev_shared *sh = ev->sh;
    int n = fc_peers_others_alive(&sh->importers, self);
    if (sh->owner_pid != self && !atomic_load(&sh->owner_destroyed) &&
        fc_pid_alive(sh->owner_pid))
        n++;
    return n;
}

FC_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    struct CUevent_st *ev;
    struct CUstream_st *s;
    if ((e = fc_event_get(event, &ev)))
        return fc_rt_err(e);
    if ((e = fc_stream_get(stream, &s))) {
        fc_event_put(ev);
        return fc_rt_err(e);
    }
    fc_event_check_exporter(ev, "cudaEventRecord");
    /* CUDA: "event and stream must be on the same CUDA context" (the legacy
     * and per-thread streams named are the current context's). */
    if (ev->ctx != fc_stream_ctx(s)) {
        fc_stream_put(s);
        fc_event_put(ev);
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    }
    struct fc_ev_shared *sh = ev->sh;
    if (sh->interprocess && atomic_load(&sh->pins) > 0 && atomic_load(&sh->issued) > 0 &&
        fc_event_other_holders(ev) > 0)
        fc_trap("event %016" PRIx64 " re-recorded while pinned (a live version names it) "
                "and open in another process: its consumers may wait on the wrong record",
                sh->id);
    struct fc_op *op = fc_op_new(FC_OP_RECORD);
    if (!op) {
        fc_stream_put(s);
        fc_event_put(ev);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    FC_COUNT(event_record_calls);
    atomic_store(&sh->recorder_pid, getpid());
    op->u.ev.ev = ev; /* the op owns our reference */
    op->u.ev.target = atomic_fetch_add(&sh->issued, 1) + 1;
    fc_stream_submit(s, op);
    fc_stream_put(s);
    return cudaSuccess;
}

FC_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (flags & ~(unsigned)cudaEventWaitExternal)
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUevent_st *ev;
    struct CUstream_st *s;
    if ((e = fc_event_get(event, &ev)))
        return fc_rt_err(e);
    if ((e = fc_stream_get(stream, &s))) {
        fc_event_put(ev);
        return fc_rt_err(e);
    }
    fc_event_check_exporter(ev, "cudaStreamWaitEvent");
    FC_COUNT(stream_wait_event_calls);
    /* The wait names the record that is the event's latest now; an event
     * never recorded is complete. */
    uint64_t target = atomic_load(&ev->sh->issued);
    if (target == 0) {
        fc_stream_put(s);
        fc_event_put(ev);
        return cudaSuccess;
    }
    struct fc_op *op = fc_op_new(FC_OP_WAIT_EVENT);
    if (!op) {
        fc_stream_put(s);
        fc_event_put(ev);
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    op->u.ev.ev = ev;
    op->u.ev.target = target;
    fc_stream_submit(s, op);
    fc_stream_put(s);
    return cudaSuccess;
}

FC_API cudaError_t cudaEventSynchronize(cudaEvent_t event)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    struct CUevent_st *ev;
    if ((e = fc_event_get(event, &ev)))
        return fc_rt_err(e);
    fc_event_check_exporter(ev, "cudaEventSynchronize");
    FC_COUNT(event_sync_calls);
    uint64_t target = atomic_load(&ev->sh->issued);
    if (target)
        fc_event_wait_target(ev, target);
    fc_event_put(ev);
    return cudaSuccess;
}

FC_API cudaError_t cudaEventQuery(cudaEvent_t event)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    struct CUevent_st *ev;
    if ((e = fc_event_get(event, &ev)))
        return fc_rt_err(e);
    fc_event_check_exporter(ev, "cudaEventQuery");
    bool done = atomic_load(&ev->sh->completed) >= atomic_load(&ev->sh->issued);
    fc_event_put(ev);
    return done ? cudaSuccess : cudaErrorNotReady;
}

/* The context a stream belongs to: for the special handles, the current
 * one (CUDA_ERROR_INVALID_CONTEXT when none is). */
FC_API CUresult cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD) {
        CUcontext c;
        if ((r = fc_drv_enter_ctx(&c)))
            return r;
        *pctx = c;
        return CUDA_SUCCESS;
    }
    struct CUstream_st *s;
    if (fc_stream_get(hStream, &s))
        return CUDA_ERROR_INVALID_HANDLE;
    *pctx = s->ctx;
    fc_stream_put(s);
    return CUDA_SUCCESS;
}

/* ---- IPC events ------------------------------------------------------------------ */

/* The IPC namespace a process is in, as FAKECUDA_IPC_NAMESPACE names it
 * (unset or empty: the host's): an interprocess event lives in shared
 * memory, so, as with CUDA, only a process that shares it (the same
 * /dev/shm: a container without --ipc=host does not) can open its handle.
 * A tag (FNV-1a of the name) travels in the handle. */
static uint32_t fc_ipc_ns(void)
{
    const char *s = getenv("FAKECUDA_IPC_NAMESPACE");
    uint32_t h = 2166136261u;

    if (!s || !*s)
        return 0;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 16777619u;
    return h ? h : 1;
}

FC_API cudaError_t cudaIpcGetEventHandle(cudaIpcEventHandle_t *handle, cudaEvent_t event)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    if (!handle)
        return fc_rt_err(cudaErrorInvalidValue);
    struct CUevent_st *ev;
    if ((e = fc_event_get(event, &ev)))
        return fc_rt_err(e);
    /* Only the creator of an event made with cudaEventInterprocess |
     * cudaEventDisableTiming can export it. */
    if (ev->imported || !ev->sh->interprocess || ev->fd < 0) {
        fc_event_put(ev);
        return fc_rt_err(cudaErrorInvalidResourceHandle);
    }
    struct fc_ipc_wire w = {
        .magic = FC_IPC_EV_MAGIC,
        .pid = getpid(),
        .fd = ev->fd,
        .id = ev->sh->id,
        .ns = fc_ipc_ns(),
    };
    memcpy(handle->reserved, &w, sizeof(w));
    fc_event_put(ev);
    FC_COUNT(ipc_get_event_calls);
    return cudaSuccess;
}

/* Maps the shared page of an exported event. Returns it, or NULL with *err
 * set to a negative errno. */
static struct fc_ev_shared *fc_event_map_peer(const struct fc_ipc_wire *w, int *err)
{
    int fd = fc_open_peer_fd(w->pid, w->fd);
    if (fd < 0) {
        *err = fd;
        return NULL;
    }
    struct fc_ev_shared head;
    ssize_t n = pread(fd, &head, sizeof(head), 0);
    if (n != (ssize_t)sizeof(head) || head.magic != FC_EV_MAGIC || head.id != w->id ||
        !head.interprocess || head.owner_pid != w->pid) {
        close(fd);
        *err = -EINVAL;
        return NULL;
    }
    void *p = mmap(NULL, fc_page_size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        *err = -ENOMEM;
        return NULL;
    }
    return p;
}

FC_API cudaError_t cudaIpcOpenEventHandle(cudaEvent_t *event, cudaIpcEventHandle_t handle)
{
    cudaError_t e = fc_rt_enter();
    if (e)
        return fc_rt_err(e);
    FC_COUNT(ipc_open_event_calls);
    if (!event)
        return fc_rt_err(cudaErrorInvalidValue);
    struct fc_ipc_wire w;
    memcpy(&w, handle.reserved, sizeof(w));
    if (w.magic != FC_IPC_EV_MAGIC)
        return fc_rt_err(cudaErrorInvalidValue);
    /* CUDA refuses IPC handles in the process that made them. */
    if (w.pid == getpid())
        return fc_rt_err(cudaErrorDeviceUninitialized);
    /* Another IPC namespace: its shared memory is not ours to map. */
    if (w.ns != fc_ipc_ns())
        return fc_rt_err(cudaErrorInvalidValue);
    int err;
    struct fc_ev_shared *sh = fc_event_map_peer(&w, &err);
    if (!sh)
        return fc_rt_err(err == -ENOMEM ? cudaErrorMemoryAllocation : cudaErrorInvalidValue);
    if (fc_peers_join(&sh->importers, getpid()) < 0) {
        munmap(sh, fc_page_size());
        return fc_rt_err(cudaErrorTooManyPeers);
    }
    if (atomic_load(&sh->owner_destroyed)) {
        fc_peers_leave(&sh->importers, getpid());
        munmap(sh, fc_page_size());
        return fc_rt_err(cudaErrorInvalidValue);
    }
    struct CUevent_st *ev = calloc(1, sizeof(*ev));
    if (!ev) {
        fc_peers_leave(&sh->importers, getpid());
        munmap(sh, fc_page_size());
        return fc_rt_err(cudaErrorMemoryAllocation);
    }
    ev->flags = cudaEventDisableTiming | cudaEventInterprocess;
    ev->imported = true;
    ev->ctx = fc_ctx_current();
    ev->fd = -1;
    ev->sh = sh;
    ev->map_len = fc_page_size();
    atomic_store(&ev->refs, 1);
    if ((e = fc_event_register(ev))) {
        fc_peers_leave(&sh->importers, getpid());
        fc_event_put(ev);
        return fc_rt_err(e);
    }
    FC_COUNT(ipc_events_open_now);
    *event = ev;
    return cudaSuccess;
}

/* ---- fakecuda_ctl.h: pins ------------------------------------------------------ */

static int fc_pin_shared(struct fc_ev_shared *sh, int delta)
{
    if (delta < 0) {
        int cur = atomic_load(&sh->pins);
        do {
            if (cur <= 0)
                return -ERANGE;
        } while (!atomic_compare_exchange_weak(&sh->pins, &cur, cur - 1));
        return 0;
    }
    atomic_fetch_add(&sh->pins, 1);
    return 0;
}

static int fc_pin_event(cudaEvent_t event, int delta)
{
    if (g_fc.forked || !event)
        return -EINVAL;
    pthread_mutex_lock(&g_fc.mu);
    bool live = fc_reg_has(&reg_events, event);
    if (live)
        atomic_fetch_add(&event->refs, 1);
    pthread_mutex_unlock(&g_fc.mu);
    if (!live)
        return -EINVAL;
    int rc = fc_pin_shared(event->sh, delta);
    fc_event_put(event);
    return rc;
}

FC_API int fakecuda_event_pin(cudaEvent_t event)
{
    return fc_pin_event(event, 1);
}

FC_API int fakecuda_event_unpin(cudaEvent_t event)
{
    return fc_pin_event(event, -1);
}

static int fc_pin_ipc(const cudaIpcEventHandle_t *handle, int delta)
{
    if (!handle)
        return -EINVAL;
    struct fc_ipc_wire w;
    memcpy(&w, handle->reserved, sizeof(w));
    if (w.magic != FC_IPC_EV_MAGIC)
        return -EINVAL;
    if (w.pid == getpid()) {
        /* Our own event: find it among the live ones. */
        if (g_fc.forked)
            return -EINVAL;
        int rc = -EINVAL;
        pthread_mutex_lock(&g_fc.mu);
        for (size_t i = 0; i < reg_events.n; i++) {
            struct CUevent_st *ev = reg_events.live[i];
            if (!ev->imported && ev->sh->id == w.id) {
                rc = fc_pin_shared(ev->sh, delta);
                break;
            }
        }
        pthread_mutex_unlock(&g_fc.mu);
        return rc;
    }
    int err;
    struct fc_ev_shared *sh = fc_event_map_peer(&w, &err);
    if (!sh)
        return err;
    int rc = atomic_load(&sh->owner_destroyed) ? -EINVAL : fc_pin_shared(sh, delta);
    munmap(sh, fc_page_size());
    return rc;
}

FC_API int fakecuda_ipc_event_pin(const cudaIpcEventHandle_t *handle)
{
    return fc_pin_ipc(handle, 1);
}

FC_API int fakecuda_ipc_event_unpin(const cudaIpcEventHandle_t *handle)
{
    return fc_pin_ipc(handle, -1);
}

FC_API int fakecuda_event_importers(cudaEvent_t event)
{
    if (g_fc.forked || !event)
        return -EINVAL;
    pthread_mutex_lock(&g_fc.mu);
    bool live = fc_reg_has(&reg_events, event);
    if (live)
        atomic_fetch_add(&event->refs, 1);
    pthread_mutex_unlock(&g_fc.mu);
    if (!live)
        return -EINVAL;
    int n = event->sh->interprocess ? fc_peers_others_alive(&event->sh->importers, getpid()) : 0;
    fc_event_put(event);
    return n;
}
