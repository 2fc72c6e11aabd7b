/*
 * fakecuda core: lazy initialisation, devices (FAKECUDA_DEVICES,
 * CUDA_VISIBLE_DEVICES, UUIDs, compute modes), contexts (primary and
 * cuCtxCreate'd, the current one per thread, created lazily where the real
 * runtime creates them, counted), error strings and last error, the fork
 * rule, traps, shared-memory helpers and the settings/stats half of
 * fakecuda_ctl.h. Any thread may call any function.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fc_internal.h"

struct fc_global g_fc = { .mu = PTHREAD_MUTEX_INITIALIZER };
struct fc_settings g_set;
struct fc_counters g_cnt;

static pthread_once_t fc_once = PTHREAD_ONCE_INIT;
static _Atomic int fc_ready;

/* The primary contexts, one per visible ordinal, and the cuCtxCreate'd
 * ones (see struct CUctx_st). */
static struct CUctx_st fc_ctx[FC_MAX_DEVICES];
static struct CUctx_st *fc_made_ctxs;

/* Per physical device: contexts of this process alive on it, and the
 * socket that claims an EXCLUSIVE_PROCESS device machine-wide (-1: none).
 * Under g_fc.mu. */
static int fc_dev_ctxs[FC_MAX_DEVICES];
static int fc_excl_fd[FC_MAX_DEVICES] = { [0 ... FC_MAX_DEVICES - 1] = -1 };
static uint64_t fc_seed_hash;

/* The runtime's device of this thread (cudaSetDevice), and the current
 * context (NULL until cudaSetDevice, a runtime call or cuCtxSetCurrent). */
static _Thread_local int tls_dev;
static _Thread_local struct CUctx_st *tls_ctx;
/* Inside a driver call served by the runtime's code (fc_drv.c): no lazy
 * context, no last error. */
static _Thread_local int tls_drv;
static _Thread_local cudaError_t tls_last_error;

#define FC_DEFAULT_DELAY_US 2000u
#define FC_DEFAULT_IPC_EVENTS_MAX 4096L

/* ---- small helpers ------------------------------------------------------- */

void fc_trap(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda: TRAP (pid %d): %s\n", (int)getpid(), msg);
    fflush(stderr);
    abort();
}

void fc_warn(const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fakecuda: warning (pid %d): %s\n", (int)getpid(), msg);
}

static size_t fc_page;

size_t fc_page_size(void)
{
    return fc_page;
}

static uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t fc_new_id(void)
{
    uint64_t n = atomic_fetch_add(&g_fc.next_id, 1) + 1;
    return splitmix64(g_fc.id_salt ^ (n * 0x2545f4914f6cdd1dull)) | 1;
}

/* A zombie still answers kill(pid, 0), but its mappings are gone: read its
 * state from /proc. */
bool fc_pid_alive(pid_t pid)
{
    if (pid <= 0)
        return false;
    if (kill(pid, 0) < 0 && errno == ESRCH)
        return false;
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno != ENOENT;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return true;
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ')
        return true;
    return p[2] != 'Z' && p[2] != 'X';
}

int fc_peers_join(struct fc_peers *p, pid_t self)
{
    for (int i = 0; i < FC_PEER_SLOTS; i++) {
        if (atomic_load(&p->slot[i].pid) == self) {
            atomic_fetch_add(&p->slot[i].count, 1);
            return 0;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < FC_PEER_SLOTS; i++) {
            int32_t cur = atomic_load(&p->slot[i].pid);
            /* The second pass takes over slots of processes that died
             * without closing. */
            if (cur != 0 && (pass == 0 || fc_pid_alive(cur)))
                continue;
            if (atomic_compare_exchange_strong(&p->slot[i].pid, &cur, self)) {
                atomic_store(&p->slot[i].count, 1);
                return 0;
            }
        }
    }
    return -ENOSPC;
}

void fc_peers_leave(struct fc_peers *p, pid_t self)
{
    for (int i = 0; i < FC_PEER_SLOTS; i++) {
        if (atomic_load(&p->slot[i].pid) != self)
            continue;
        if (atomic_fetch_sub(&p->slot[i].count, 1) <= 1) {
            atomic_store(&p->slot[i].count, 0);
            atomic_store(&p->slot[i].pid, 0);
        }
        return;
    }
}

int fc_peers_others_alive(struct fc_peers *p, pid_t self)
{
    int n = 0;
    for (int i = 0; i < FC_PEER_SLOTS; i++) {
        int32_t pid = atomic_load(&p->slot[i].pid);
        if (pid == 0 || pid == self)
            continue;
        if (fc_pid_alive(pid))
            n++;
    }
    return n;
}

void fc_futex_wait(_Atomic uint32_t *word, uint32_t expected, long timeout_ns)
{
    struct timespec ts = { .tv_sec = timeout_ns / 1000000000L,
                           .tv_nsec = timeout_ns % 1000000000L };
    /* Not FUTEX_PRIVATE: the word may be shared with other processes. */
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

void fc_futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

int fc_open_peer_fd(int32_t pid, int32_t fd)
{
    static const char want[] = "/memfd:fakecuda-";
    char path[64], target[256];
    if (pid <= 0 || fd < 0)
        return -EINVAL;
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, (int)fd);
    /* The number may have been reused for any file since the handle was
     * made: never open what is not one of our memfds. */
    ssize_t n = readlink(path, target, sizeof(target) - 1);
    if (n < 0)
        return -errno;
    target[n] = '\0';
    if (strncmp(target, want, sizeof(want) - 1) != 0)
        return -EINVAL;
    int nfd = open(path, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    return nfd < 0 ? -errno : nfd;
}

int fc_memfd_new(const char *name, size_t data_len)
{
    size_t page = fc_page_size();
    int fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    if (ftruncate(fd, (off_t)(page + data_len)) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

/* ---- initialisation and the fork rule ------------------------------------ */

static void fc_atfork_prepare(void)
{
    pthread_mutex_lock(&g_fc.mu);
}

static void fc_atfork_parent(void)
{
    pthread_mutex_unlock(&g_fc.mu);
}

static void fc_atfork_child(void)
{
    pthread_mutex_unlock(&g_fc.mu);
    /* A child holds no context of its parent's: its copy of a claim on an
     * EXCLUSIVE_PROCESS device must not keep the device busy. */
    for (int i = 0; i < FC_MAX_DEVICES; i++) {
        if (fc_excl_fd[i] >= 0)
            close(fc_excl_fd[i]);
        fc_excl_fd[i] = -1;
        fc_dev_ctxs[i] = 0;
    }
    /* Like real CUDA: a child of an initialised process has no usable CUDA
     * state (its stream workers do not exist here). */
    if (atomic_load(&fc_ready))
        g_fc.forked = true;
}

__attribute__((constructor)) static void fc_load(void)
{
    fc_page = (size_t)sysconf(_SC_PAGESIZE);
    pthread_atfork(fc_atfork_prepare, fc_atfork_parent, fc_atfork_child);
}

static unsigned fc_env_delay(void)
{
    const char *s = getenv("FAKECUDA_DELAY_US");
    if (!s || !*s)
        return FC_DEFAULT_DELAY_US;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v > 60000000ul) {
        fc_warn("ignoring FAKECUDA_DELAY_US=%s", s);
        return FC_DEFAULT_DELAY_US;
    }
    return (unsigned)v;
}

static int fc_env_reopen(void)
{
    const char *s = getenv("FAKECUDA_IPC_REOPEN");
    if (!s || !*s || !strcmp(s, "fail"))
        return FAKECUDA_REOPEN_FAIL;
    if (!strcmp(s, "refcount"))
        return FAKECUDA_REOPEN_REFCOUNT;
    fc_warn("ignoring FAKECUDA_IPC_REOPEN=%s (fail|refcount)", s);
    return FAKECUDA_REOPEN_FAIL;
}

static unsigned long fc_env_fail_d2h(void)
{
    const char *s = getenv("FAKECUDA_FAIL_D2H");
    if (!s || !*s)
        return 0;
    char *end;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end) {
        fc_warn("ignoring FAKECUDA_FAIL_D2H=%s", s);
        return 0;
    }
    return v;
}

static long fc_env_ipc_events_max(void)
{
    const char *s = getenv("FAKECUDA_IPC_EVENTS_MAX");
    if (!s || !*s)
        return FC_DEFAULT_IPC_EVENTS_MAX;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < 0) {
        fc_warn("ignoring FAKECUDA_IPC_EVENTS_MAX=%s", s);
        return FC_DEFAULT_IPC_EVENTS_MAX;
    }
    return v;
}

long fc_ipc_event_limit(void)
{
    return atomic_load(&g_set.ipc_events_max);
}

/* FAKECUDA_COMPUTE_MODE: one mode per physical device, comma-separated
 * (default, exclusive_process, prohibited, or their CUcomputemode numbers);
 * devices not named are in the default mode. */
static void fc_env_compute_modes(void)
{
    const char *s = getenv("FAKECUDA_COMPUTE_MODE");
    char buf[512], *save = NULL;
    int i = 0;
    if (!s || !*s)
        return;
    snprintf(buf, sizeof(buf), "%s", s);
    for (char *tok = strtok_r(buf, ",", &save); tok && i < FC_MAX_DEVICES;
         tok = strtok_r(NULL, ",", &save), i++) {
        while (isspace((unsigned char)*tok))
            tok++;
        if (!strcasecmp(tok, "default") || !strcmp(tok, "0") || !*tok)
            g_fc.compute_mode[i] = CU_COMPUTEMODE_DEFAULT;
        else if (!strcasecmp(tok, "exclusive_process") || !strcmp(tok, "3"))
            g_fc.compute_mode[i] = CU_COMPUTEMODE_EXCLUSIVE_PROCESS;
        else if (!strcasecmp(tok, "prohibited") || !strcmp(tok, "2"))
            g_fc.compute_mode[i] = CU_COMPUTEMODE_PROHIBITED;
        else
            fc_warn("ignoring FAKECUDA_COMPUTE_MODE entry %d '%s' "
                    "(default|exclusive_process|prohibited)", i, tok);
    }
}

/* FAKECUDA_HOST_REGISTER_READONLY (default 1): 0 plays a device without
 * cudaDevAttrHostRegisterReadOnlySupported. */
bool fc_host_register_readonly_supported(void)
{
    const char *s = getenv("FAKECUDA_HOST_REGISTER_READONLY");
    return !s || strcmp(s, "0") != 0;
}

bool fc_vmm_fd_supported(void)
{
    const char *s = getenv("FAKECUDA_VMM_FD");
    return !s || strcmp(s, "0") != 0;
}

static void fc_uuid_string(const unsigned char u[16], char out[41])
{
    static const int dash[] = { 4, 6, 8, 10 };
    char *p = out + sprintf(out, "GPU-");
    for (int i = 0, d = 0; i < 16; i++) {
        if (d < 4 && i == dash[d]) {
            *p++ = '-';
            d++;
        }
        p += sprintf(p, "%02x", u[i]);
    }
}

/* One CUDA_VISIBLE_DEVICES entry: a physical index, or "GPU-" and a unique
 * prefix of a UUID. Returns the physical index or -1. */
static int fc_parse_visible_entry(const char *tok)
{
    if (!*tok)
        return -1;
    bool digits = true;
    for (const char *p = tok; *p; p++)
        digits = digits && isdigit((unsigned char)*p);
    if (digits) {
        long v = strtol(tok, NULL, 10);
        return v < g_fc.nphys ? (int)v : -1;
    }
    if (strncasecmp(tok, "GPU-", 4) != 0)
        return -1;
    int found = -1;
    for (int i = 0; i < g_fc.nphys; i++) {
        char s[41];
        fc_uuid_string(g_fc.uuid[i], s);
        if (strncasecmp(s, tok, strlen(tok)) == 0) {
            if (found >= 0)
                return -1; /* ambiguous prefix */
            found = i;
        }
    }
    return found;
}

static void fc_init(void)
{
    const char *s = getenv("FAKECUDA_DEVICES");
    g_fc.nphys = 1;
    if (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (*end || v < 0 || v > FC_MAX_DEVICES)
            fc_warn("ignoring FAKECUDA_DEVICES=%s (0..%d)", s, FC_MAX_DEVICES);
        else
            g_fc.nphys = (int)v;
    }

    /* UUIDs depend only on the seed and the physical index, so every process
     * of a test agrees on them whatever its CUDA_VISIBLE_DEVICES. */
    const char *seed = getenv("FAKECUDA_UUID_SEED");
    if (!seed)
        seed = "fakecuda";
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = seed; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    for (int i = 0; i < FC_MAX_DEVICES; i++) {
        uint64_t a = splitmix64(h ^ (uint64_t)(i + 1));
        uint64_t b = splitmix64(a ^ 0x5bd1e995ull);
        memcpy(g_fc.uuid[i], &a, 8);
        memcpy(g_fc.uuid[i] + 8, &b, 8);
        g_fc.uuid[i][6] = (unsigned char)((g_fc.uuid[i][6] & 0x0f) | 0x40);
        fc_ctx[i].ordinal = i;
        fc_ctx[i].primary = true;
    }
    fc_seed_hash = h;
    fc_env_compute_modes();

    /* Real CUDA: the list stops at the first invalid entry. */
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (!vis) {
        g_fc.nvisible = g_fc.nphys;
        for (int i = 0; i < g_fc.nphys; i++)
            g_fc.visible[i] = i;
    } else {
        char buf[1024];
        snprintf(buf, sizeof(buf), "%s", vis);
        char *save = NULL;
        g_fc.nvisible = 0;
        for (char *tok = strtok_r(buf, ",", &save); tok && g_fc.nvisible < FC_MAX_DEVICES;
             tok = strtok_r(NULL, ",", &save)) {
            while (isspace((unsigned char)*tok))
                tok++;
            char *e = tok + strlen(tok);
            while (e > tok && isspace((unsigned char)e[-1]))
                *--e = '\0';
            int phys = fc_parse_visible_entry(tok);
            bool dup = false;
            for (int i = 0; i < g_fc.nvisible; i++)
                dup = dup || g_fc.visible[i] == phys;
            if (phys < 0 || dup)
                break;
            g_fc.visible[g_fc.nvisible++] = phys;
        }
    }

    if (!atomic_load(&g_set.delay_set))
        atomic_store(&g_set.delay_us, fc_env_delay());
    if (!atomic_load(&g_set.reopen_set))
        atomic_store(&g_set.reopen, fc_env_reopen());
    if (!atomic_load(&g_set.ipc_events_max_set))
        atomic_store(&g_set.ipc_events_max, fc_env_ipc_events_max());
    atomic_store(&g_set.fail_d2h, fc_env_fail_d2h());

    if (getrandom(&g_fc.id_salt, sizeof(g_fc.id_salt), 0) != sizeof(g_fc.id_salt))
        g_fc.id_salt = (uint64_t)getpid() << 32 ^ (uint64_t)time(NULL);

    g_fc.initialized = true;
    atomic_store(&fc_ready, 1);
}

static int fc_ensure_init(void)
{
    if (g_fc.forked)
        return -1;
    pthread_once(&fc_once, fc_init);
    return 0;
}

cudaError_t fc_rt_err(cudaError_t e)
{
    if (e != cudaSuccess && e != cudaErrorNotReady && !tls_drv)
        tls_last_error = e;
    return e;
}

/* ---- contexts -------------------------------------------------------------- */

/* Claims physical device phys for one more context of this process: fails
 * on a PROHIBITED device, and on an EXCLUSIVE_PROCESS device that another
 * live process holds a context on. The claim is an abstract Unix socket
 * named after the device (and the UUID seed, so that unrelated tests do not
 * meet): it goes away with the process, whatever way it dies. Caller holds
 * g_fc.mu. */
static CUresult fc_dev_claim(int phys)
{
    int mode = g_fc.compute_mode[phys];
    if (mode == CU_COMPUTEMODE_PROHIBITED)
        return CUDA_ERROR_DEVICE_UNAVAILABLE;
    if (mode == CU_COMPUTEMODE_EXCLUSIVE_PROCESS && fc_dev_ctxs[phys] == 0) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        int n = snprintf(sa.sun_path + 1, sizeof(sa.sun_path) - 1,
                         "fakecuda-exclusive-%u-%016llx-%d", (unsigned)getuid(),
                         (unsigned long long)fc_seed_hash, phys);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return CUDA_ERROR_OUT_OF_MEMORY;
        if (bind(fd, (struct sockaddr *)&sa,
                 (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n)) < 0) {
            close(fd);
            return CUDA_ERROR_DEVICE_UNAVAILABLE;
        }
        fc_excl_fd[phys] = fd;
    }
    fc_dev_ctxs[phys]++;
    return CUDA_SUCCESS;
}

static void fc_dev_unclaim(int phys)
{
    if (--fc_dev_ctxs[phys] == 0 && fc_excl_fd[phys] >= 0) {
        close(fc_excl_fd[phys]);
        fc_excl_fd[phys] = -1;
    }
}

/* Creates context c (its device claimed, the creation counted) when it is
 * not active. Caller holds g_fc.mu. */
static CUresult fc_ctx_activate(struct CUctx_st *c)
{
    if (atomic_load(&c->active))
        return CUDA_SUCCESS;
    CUresult r = fc_dev_claim(g_fc.visible[c->ordinal]);
    if (r)
        return r;
    atomic_store(&c->active, true);
    atomic_fetch_add(&g_cnt.ctx_created[c->ordinal], 1);
    return CUDA_SUCCESS;
}

static void fc_ctx_deactivate(struct CUctx_st *c)
{
    if (!atomic_load(&c->active))
        return;
    atomic_store(&c->active, false);
    fc_dev_unclaim(g_fc.visible[c->ordinal]);
}

/* The runtime's hold on primary context c: created if need be, and kept
 * (the runtime never gives a primary context back). */
static cudaError_t fc_rt_hold(struct CUctx_st *c)
{
    pthread_mutex_lock(&g_fc.mu);
    CUresult r = fc_ctx_activate(c);
    if (!r)
        atomic_store(&c->rt_held, true);
    pthread_mutex_unlock(&g_fc.mu);
    return r == CUDA_SUCCESS ? cudaSuccess
           : r == CUDA_ERROR_DEVICE_UNAVAILABLE ? cudaErrorDevicesUnavailable
                                                : cudaErrorMemoryAllocation;
}

cudaError_t fc_rt_enter_noctx(void)
{
    if (fc_ensure_init() < 0)
        return cudaErrorInitializationError;
    g_fc.driver_initialized = true; /* the runtime calls cuInit itself */
    if (g_fc.nvisible == 0)
        return cudaErrorNoDevice;
    return cudaSuccess;
}

cudaError_t fc_rt_enter(void)
{
    if (tls_drv)
        return !tls_ctx ? cudaErrorDeviceUninitialized
               : atomic_load(&tls_ctx->active) ? cudaSuccess : cudaErrorContextIsDestroyed;
    cudaError_t e = fc_rt_enter_noctx();
    if (e)
        return e;
    struct CUctx_st *c = tls_ctx;
    if (c && !c->primary)
        return atomic_load(&c->active) ? cudaSuccess : cudaErrorContextIsDestroyed;
    if (c && atomic_load(&c->rt_held) && atomic_load(&c->active))
        return cudaSuccess;
    /* No context yet: the runtime creates the primary context of its
     * device for this thread, which is what costs a process memory on a
     * GPU it never meant to use. */
    if (!c)
        c = &fc_ctx[tls_dev];
    if ((e = fc_rt_hold(c)))
        return e;
    tls_ctx = c;
    return cudaSuccess;
}

CUresult fc_drv_enter(void)
{
    if (fc_ensure_init() < 0 || !g_fc.driver_initialized)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

CUresult fc_drv_enter_ctx(CUcontext *out)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!tls_ctx)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!atomic_load(&tls_ctx->active))
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    if (out)
        *out = tls_ctx;
    return CUDA_SUCCESS;
}

void fc_drv_begin(void)
{
    tls_drv = 1;
}

void fc_drv_end(void)
{
    tls_drv = 0;
}

CUcontext fc_ctx_current(void)
{
    return tls_ctx;
}

int fc_current_device(void)
{
    return tls_ctx ? tls_ctx->ordinal : tls_dev;
}

int fc_phys_of_ordinal(int ordinal)
{
    if (ordinal < 0 || ordinal >= g_fc.nvisible)
        return -1;
    return g_fc.visible[ordinal];
}

int fc_ordinal_of_phys(int phys)
{
    for (int i = 0; i < g_fc.nvisible; i++)
        if (g_fc.visible[i] == phys)
            return i;
    return cudaInvalidDeviceId;
}

/* ---- error strings --------------------------------------------------------- */

#define FC_RT_ERRORS(X)                                                              \
    X(cudaSuccess, "no error")                                                       \
    X(cudaErrorInvalidValue, "invalid argument")                                     \
    X(cudaErrorMemoryAllocation, "out of memory")                                    \
    X(cudaErrorInitializationError, "initialization error")                          \
    X(cudaErrorCudartUnloading, "driver shutting down")                              \
    X(cudaErrorInvalidDevicePointer, "invalid device pointer")                       \
    X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")          \
    X(cudaErrorInsufficientDriver,                                                   \
      "CUDA driver version is insufficient for CUDA runtime version")                \
    X(cudaErrorNoDevice, "no CUDA-capable device is detected")                       \
    X(cudaErrorInvalidDevice, "invalid device ordinal")                              \
    X(cudaErrorDeviceUninitialized, "invalid device context")                        \
    X(cudaErrorMapBufferObjectFailed, "mapping of buffer object failed")             \
    X(cudaErrorAlreadyMapped, "resource already mapped")                             \
    X(cudaErrorInvalidResourceHandle, "invalid resource handle")                     \
    X(cudaErrorNotReady, "device not ready")                                         \
    X(cudaErrorIllegalAddress, "an illegal memory access was encountered")           \
    X(cudaErrorTooManyPeers, "peer mapping resources exhausted")                     \
    X(cudaErrorHostMemoryAlreadyRegistered,                                          \
      "part or all of the requested memory range is already mapped")                 \
    X(cudaErrorHostMemoryNotRegistered,                                              \
      "pointer does not correspond to a registered memory region")                   \
    X(cudaErrorLaunchFailure, "unspecified launch failure")                          \
    X(cudaErrorNotPermitted, "operation not permitted")                              \
    X(cudaErrorNotSupported, "operation not supported")                              \
    X(cudaErrorDevicesUnavailable, "CUDA-capable device(s) is/are busy or unavailable") \
    X(cudaErrorContextIsDestroyed, "context is destroyed")                           \
    X(cudaErrorUnknown, "unknown error")

#define FC_DRV_ERRORS(X)                                                             \
    X(CUDA_SUCCESS, "no error")                                                      \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                  \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                     \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error")                            \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                              \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                    \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                           \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                          \
    X(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed")                      \
    X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                          \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                          \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                      \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")        \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                           \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                           \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable") \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                       \
    X(CUDA_ERROR_ILLEGAL_STATE, "the operation cannot be performed in the present state") \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

FC_API const char *cudaGetErrorString(cudaError_t error)
{
#define X(code, text)                                                                \
    if (error == code)                                                               \
        return text;
    FC_RT_ERRORS(X)
#undef X
    return "unrecognized error code";
}

FC_API const char *cudaGetErrorName(cudaError_t error)
{
#define X(code, text)                                                                \
    if (error == code)                                                               \
        return #code;
    FC_RT_ERRORS(X)
#undef X
    return "unrecognized error code";
}

FC_API cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tls_last_error;
    tls_last_error = cudaSuccess;
    return e;
}

FC_API cudaError_t cudaPeekAtLastError(void)
{
    return tls_last_error;
}

FC_API CUresult cuGetErrorString(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
#define X(code, text)                                                                \
    if (error == code) {                                                             \
        *pStr = text;                                                                \
        return CUDA_SUCCESS;                                                         \
    }
    FC_DRV_ERRORS(X)
#undef X
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGetErrorName(CUresult error, const char **pStr)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
#define X(code, text)                                                                \
    if (error == code) {                                                             \
        *pStr = #code;                                                               \
        return CUDA_SUCCESS;                                                         \
    }
    FC_DRV_ERRORS(X)
#undef X
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- runtime: devices -------------------------------------------------------- */

FC_API cudaError_t cudaGetDeviceCount(int *count)
{
    if (!count)
        return fc_rt_err(cudaErrorInvalidValue);
    cudaError_t e = fc_rt_enter_noctx();
    *count = e == cudaSuccess ? g_fc.nvisible : 0;
    return fc_rt_err(e);
}

/* Never creates a context: the device of the current one, else the
 * thread's runtime device (0 on a thread that never chose). */
FC_API cudaError_t cudaGetDevice(int *device)
{
    cudaError_t e = fc_rt_enter_noctx();
    if (e)
        return fc_rt_err(e);
    if (!device)
        return fc_rt_err(cudaErrorInvalidValue);
    *device = fc_current_device();
    return cudaSuccess;
}

/* CUDA >= 12: creates the device's primary context at once (runtime header:
 * "This function will also immediately initialize the runtime state on the
 * primary context, and the context will be current on device
 * immediately"), and fails where the compute mode forbids one. */
FC_API cudaError_t cudaSetDevice(int device)
{
    cudaError_t e = fc_rt_enter_noctx();
    if (e)
        return fc_rt_err(e);
    if (device < 0 || device >= g_fc.nvisible)
        return fc_rt_err(cudaErrorInvalidDevice);
    if ((e = fc_rt_hold(&fc_ctx[device])))
        return fc_rt_err(e);
    tls_dev = device;
    tls_ctx = &fc_ctx[device];
    return cudaSuccess;
}

FC_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *prop, int device)
{
    cudaError_t e = fc_rt_enter_noctx();
    if (e)
        return fc_rt_err(e);
    if (!prop)
        return fc_rt_err(cudaErrorInvalidValue);
    int phys = fc_phys_of_ordinal(device);
    if (phys < 0)
        return fc_rt_err(cudaErrorInvalidDevice);
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "FakeCUDA Device %d", phys);
    memcpy(prop->uuid.bytes, g_fc.uuid[phys], 16);
    prop->totalGlobalMem = (size_t)80 << 30;
    prop->sharedMemPerBlock = 48 << 10;
    prop->regsPerBlock = 65536;
    prop->warpSize = 32;
    prop->maxThreadsPerBlock = 1024;
    prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
    prop->maxThreadsDim[2] = 64;
    prop->maxGridSize[0] = INT_MAX;
    prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 132;
    prop->canMapHostMemory = 1;
    prop->pciBusID = 0x10 + phys;
    prop->unifiedAddressing = 1;
    prop->hostRegisterSupported = 1;
    prop->memoryPoolsSupported = 1;
    prop->ipcEventSupported = 1;
    prop->hostRegisterReadOnlySupported = fc_host_register_readonly_supported();
    return cudaSuccess;
}

FC_API cudaError_t cudaDeviceGetAttribute(int *value, enum cudaDeviceAttr attr, int device)
{
    cudaError_t e = fc_rt_enter_noctx();
    if (e)
        return fc_rt_err(e);
    if (!value)
        return fc_rt_err(cudaErrorInvalidValue);
    int phys = fc_phys_of_ordinal(device);
    if (phys < 0)
        return fc_rt_err(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = 132; break;
    case cudaDevAttrIntegrated: *value = 0; break;
    case cudaDevAttrPciBusId: *value = 0x10 + phys; break;
    case cudaDevAttrPciDeviceId: *value = 0; break;
    case cudaDevAttrPciDomainId: *value = 0; break;
    case cudaDevAttrUnifiedAddressing: *value = 1; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrManagedMemory: *value = 1; break;
    case cudaDevAttrConcurrentManagedAccess: *value = 0; break;
    case cudaDevAttrCanUseHostPointerForRegisteredMem: *value = 1; break;
    case cudaDevAttrHostRegisterSupported: *value = 1; break;
    case cudaDevAttrMemoryPoolsSupported: *value = 1; break;
    case cudaDevAttrMemoryPoolSupportedHandleTypes: *value = 0; break;
    case cudaDevAttrIpcEventSupport: *value = 1; break;
    case cudaDevAttrComputeMode: *value = g_fc.compute_mode[phys]; break;
    case cudaDevAttrHostRegisterReadOnlySupported: *value = fc_host_register_readonly_supported(); break;
    default: return fc_rt_err(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

FC_API cudaError_t cudaDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return fc_rt_err(cudaErrorInvalidValue);
    *driverVersion = CUDA_VERSION;
    return cudaSuccess;
}

FC_API cudaError_t cudaRuntimeGetVersion(int *runtimeVersion)
{
    if (!runtimeVersion)
        return fc_rt_err(cudaErrorInvalidValue);
    *runtimeVersion = CUDART_VERSION;
    return cudaSuccess;
}

/* ---- driver: init, devices, contexts ----------------------------------------- */

FC_API CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (fc_ensure_init() < 0)
        return CUDA_ERROR_NOT_INITIALIZED;
    g_fc.driver_initialized = true;
    return g_fc.nvisible ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

FC_API CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = CUDA_VERSION;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetCount(int *count)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = g_fc.nvisible;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    if (ordinal < 0 || ordinal >= g_fc.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

/* cuda.h maps cuDeviceGetUuid to cuDeviceGetUuid_v2; both are exported by
 * libcuda, so both are here. */
FC_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = fc_phys_of_ordinal(dev);
    if (phys < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    memcpy(uuid->bytes, g_fc.uuid[phys], 16);
    return CUDA_SUCCESS;
}

#undef cuDeviceGetUuid
CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
FC_API CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid_v2(uuid, dev);
}

FC_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = fc_phys_of_ordinal(dev);
    if (phys < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "FakeCUDA Device %d", phys);
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    int phys = fc_phys_of_ordinal(dev);
    if (phys < 0)
        return CUDA_ERROR_INVALID_DEVICE;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + phys; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
        *pi = fc_vmm_fd_supported();
        break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: *pi = g_fc.compute_mode[phys]; break;
    case CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED: *pi = fc_host_register_readonly_supported(); break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* A context handle this process made (destroyed or not). Caller holds
 * g_fc.mu. */
static bool fc_ctx_known(CUcontext ctx)
{
    for (int i = 0; i < g_fc.nvisible; i++)
        if (ctx == &fc_ctx[i])
            return true;
    for (struct CUctx_st *c = fc_made_ctxs; c; c = c->next)
        if (c == ctx)
            return true;
    return false;
}

/* Creates the primary context when it is not active (counted, and refused
 * where the compute mode forbids it); does not make it current. */
FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_fc.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_fc.mu);
    r = fc_ctx_activate(&fc_ctx[dev]);
    if (!r)
        fc_ctx[dev].retains++;
    pthread_mutex_unlock(&g_fc.mu);
    if (!r)
        *pctx = &fc_ctx[dev];
    return r;
}

/* The last release destroys the primary context unless the runtime holds
 * it (the fake's runtime never lets go of one it initialised). */
FC_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (dev < 0 || dev >= g_fc.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&g_fc.mu);
    struct CUctx_st *c = &fc_ctx[dev];
    if (c->retains <= 0) {
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--c->retains == 0 && !atomic_load(&c->rt_held)) {
        fc_ctx_deactivate(c);
    }
    pthread_mutex_unlock(&g_fc.mu);
    return r;
}

FC_API CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_fc.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = atomic_load(&fc_ctx[dev].active);
    return CUDA_SUCCESS;
}

/* CUDA 13's cuCtxCreate (cuCtxCreate_v4): a new, non-primary context, made
 * current on the calling thread. The fake keeps one current context per
 * thread, not a stack: whatever was current is replaced, as with
 * cuCtxSetCurrent. */
FC_API CUresult cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                            unsigned int flags, CUdevice dev)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    (void)ctxCreateParams;
    (void)flags;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    if (dev < 0 || dev >= g_fc.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof(*c));
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->ordinal = dev;
    pthread_mutex_lock(&g_fc.mu);
    r = fc_ctx_activate(c);
    if (!r) {
        c->next = fc_made_ctxs;
        fc_made_ctxs = c;
    }
    pthread_mutex_unlock(&g_fc.mu);
    if (r) {
        free(c);
        return r;
    }
    tls_ctx = c;
    *pctx = c;
    return CUDA_SUCCESS;
}

/* Destroys a cuCtxCreate'd context (its handle stays known: using it is
 * CUDA_ERROR_CONTEXT_IS_DESTROYED). Its streams and events are not torn
 * down: the fake only refuses new work in it. */
FC_API CUresult cuCtxDestroy(CUcontext ctx)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    pthread_mutex_lock(&g_fc.mu);
    if (!ctx || !fc_ctx_known(ctx) || ctx->primary)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (!atomic_load(&ctx->active))
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    else
        fc_ctx_deactivate(ctx);
    pthread_mutex_unlock(&g_fc.mu);
    if (!r && tls_ctx == ctx)
        tls_ctx = NULL;
    return r;
}

FC_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = tls_ctx;
    return CUDA_SUCCESS;
}

/* NULL unbinds the current context. The runtime follows: its calls use the
 * context made current here (cudaGetDevice answers its device). */
FC_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult r = fc_drv_enter();
    if (r)
        return r;
    if (ctx) {
        pthread_mutex_lock(&g_fc.mu);
        bool known = fc_ctx_known(ctx);
        bool dead = known && !ctx->primary && !atomic_load(&ctx->active);
        pthread_mutex_unlock(&g_fc.mu);
        if (!known)
            return CUDA_ERROR_INVALID_CONTEXT;
        if (dead)
            return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    tls_ctx = ctx;
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetDevice(CUdevice *device)
{
    CUcontext c;
    CUresult r = fc_drv_enter_ctx(&c);
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->ordinal;
    return CUDA_SUCCESS;
}

CUcontext fc_ctx_of_ordinal(int ordinal)
{
    return ordinal >= 0 && ordinal < g_fc.nvisible ? &fc_ctx[ordinal] : NULL;
}

/* ---- fakecuda_ctl.h: settings and counters ----------------------------------- */

FC_API int fakecuda_present(void)
{
    return 1;
}

FC_API void fakecuda_set_delay_us(unsigned us)
{
    atomic_store(&g_set.delay_us, us);
    atomic_store(&g_set.delay_set, 1);
}

FC_API unsigned fakecuda_get_delay_us(void)
{
    if (!atomic_load(&g_set.delay_set) && !atomic_load(&fc_ready))
        return fc_env_delay();
    return atomic_load(&g_set.delay_us);
}

FC_API void fakecuda_set_event_destroy_delay_us(unsigned us)
{
    atomic_store(&g_set.destroy_delay_us, us);
}

FC_API void fakecuda_set_ipc_reopen(enum fakecuda_reopen policy)
{
    atomic_store(&g_set.reopen, (int)policy);
    atomic_store(&g_set.reopen_set, 1);
}

FC_API void fakecuda_get_stats(struct fakecuda_stats *out)
{
    if (!out)
        return;
#define L(f) out->f = atomic_load(&g_cnt.f)
    L(malloc_calls); L(free_calls);
    L(ipc_get_mem_calls); L(ipc_open_mem_calls); L(ipc_close_mem_calls);
    L(ipc_mem_open_now);
    L(ipc_get_event_calls); L(ipc_open_event_calls); L(ipc_events_open_now);
    L(event_record_calls); L(stream_wait_event_calls);
    L(event_sync_calls); L(stream_sync_calls); L(device_sync_calls);
    L(memcpy_calls); L(memset_calls); L(host_func_calls);
    L(vmm_create_calls); L(vmm_export_calls); L(vmm_import_calls);
    L(live_allocations); L(live_streams); L(live_events); L(live_vmm_handles);
    L(live_ipc_events);
#undef L
}

FC_API long fakecuda_contexts_created(int ordinal)
{
    if (ordinal < 0 || ordinal >= FC_MAX_DEVICES)
        return -EINVAL;
    return (long)atomic_load(&g_cnt.ctx_created[ordinal]);
}

FC_API void fakecuda_set_ipc_event_limit(long max)
{
    atomic_store(&g_set.ipc_events_max, max < 0 ? 0 : max);
    atomic_store(&g_set.ipc_events_max_set, 1);
}

FC_API void fakecuda_fail_d2h(unsigned long nth)
{
    atomic_store(&g_set.d2h_seen, 0);
    atomic_store(&g_set.fail_d2h, nth);
}

FC_API void fakecuda_reset_stats(void)
{
#define Z(f) atomic_store(&g_cnt.f, 0)
    Z(malloc_calls); Z(free_calls);
    Z(ipc_get_mem_calls); Z(ipc_open_mem_calls); Z(ipc_close_mem_calls);
    Z(ipc_get_event_calls); Z(ipc_open_event_calls);
    Z(event_record_calls); Z(stream_wait_event_calls);
    Z(event_sync_calls); Z(stream_sync_calls); Z(device_sync_calls);
    Z(memcpy_calls); Z(memset_calls); Z(host_func_calls);
    Z(vmm_create_calls); Z(vmm_export_calls); Z(vmm_import_calls);
#undef Z
}

FC_API void fakecuda_reset(void)
{
    atomic_store(&g_set.delay_set, 0);
    atomic_store(&g_set.reopen_set, 0);
    atomic_store(&g_set.ipc_events_max_set, 0);
    atomic_store(&g_set.destroy_delay_us, 0);
    atomic_store(&g_set.delay_us, fc_env_delay());
    atomic_store(&g_set.reopen, fc_env_reopen());
    atomic_store(&g_set.ipc_events_max, fc_env_ipc_events_max());
    atomic_store(&g_set.fail_d2h, fc_env_fail_d2h());
    atomic_store(&g_set.d2h_seen, 0);
    tls_last_error = cudaSuccess;
    fakecuda_reset_stats();
}
