/*
 * Tests of libfakecuda itself. The test process never touches CUDA: like real
 * CUDA, the fake refuses CUDA in a child forked after initialisation, so every
 * CUDA call runs in forked children (PR_SET_PDEATHSIG) that talk over a
 * SOCK_SEQPACKET socketpair and report through their exit status and stderr.
 * Timeouts scale with DLSHARE_TEST_TIMEOUT_SCALE (default 1).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fakecuda_ctl.h"

/* ---- helpers shared by parent and children ---------------------------------- */

static double timeout_scale(void)
{
    const char *s = getenv("DLSHARE_TEST_TIMEOUT_SCALE");
    double v = s ? strtod(s, NULL) : 1.0;
    return v > 0 ? v : 1.0;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
}

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own fd */
}

/* Fill with a reproducible, position-dependent pattern. */
static void pattern(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (unsigned char)x;
    }
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* ---- child-side checks: a failed check ends the child with status 1 --------- */

static _Noreturn void child_fail(const char *file, int line, const char *what)
{
    fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
    _exit(1);
}

static _Noreturn void child_fail_rt(const char *file, int line, const char *what, cudaError_t got,
                                    cudaError_t want)
{
    fprintf(stderr, "%s:%d: %s returned %s (%s), expected %s\n", file, line, what,
            cudaGetErrorName(got), cudaGetErrorString(got), cudaGetErrorName(want));
    _exit(1);
}

static _Noreturn void child_fail_drv(const char *file, int line, const char *what, CUresult got,
                                     CUresult want)
{
    const char *g = NULL, *w = NULL;
    cuGetErrorName(got, &g);
    cuGetErrorName(want, &w);
    fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", file, line, what, g ? g : "?",
            w ? w : "?");
    _exit(1);
}

#define CK(c)                                                                      \
    do {                                                                           \
        if (!(c))                                                                  \
            child_fail(__FILE__, __LINE__, #c);                                    \
    } while (0)
#define CKE(call, want)                                                            \
    do {                                                                           \
        cudaError_t e_ = (call);                                                   \
        if (e_ != (want))                                                          \
            child_fail_rt(__FILE__, __LINE__, #call, e_, (want));                  \
    } while (0)
#define CKC(call) CKE(call, cudaSuccess)
#define CKDE(call, want)                                                           \
    do {                                                                           \
        CUresult r_ = (call);                                                      \
        if (r_ != (want))                                                          \
            child_fail_drv(__FILE__, __LINE__, #call, r_, (want));                 \
    } while (0)
#define CKD(call) CKDE(call, CUDA_SUCCESS)

/* ---- messages between children ---------------------------------------------------- */

enum tag {
    T_HANDLES = 1,
    T_DONE,
    T_OPENED,
    T_FREED,
    T_RELEASED,
    T_DEVICES,
};

struct msg {
    int tag;
    size_t size;
    cudaIpcMemHandle_t mh;
    cudaIpcEventHandle_t eh;
    int count;
    int device;
    unsigned char uuid[4][16];
};

static void msg_send(int sock, int tag, const struct msg *in, int pass_fd)
{
    struct msg m;
    if (in)
        m = *in;
    else
        memset(&m, 0, sizeof(m));
    m.tag = tag;
    struct iovec iov = { .iov_base = &m, .iov_len = sizeof(m) };
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } c;
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
    if (pass_fd >= 0) {
        memset(&c, 0, sizeof(c));
        mh.msg_control = c.buf;
        mh.msg_controllen = sizeof(c.buf);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof(int));
    }
    CK(sendmsg(sock, &mh, MSG_NOSIGNAL) == (ssize_t)sizeof(m));
}

/* Returns the tag, or 0 when the peer went away. */
static int msg_recv(int sock, struct msg *m, int *fd_out)
{
    struct pollfd pfd = { .fd = sock, .events = POLLIN };
    int rc = poll(&pfd, 1, (int)(20000 * timeout_scale()));
    CK(rc == 1);
    union {
        struct cmsghdr h;
        char buf[CMSG_SPACE(sizeof(int))];
    } c;
    struct iovec iov = { .iov_base = m, .iov_len = sizeof(*m) };
    struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                         .msg_controllen = sizeof(c.buf) };
    ssize_t n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
    if (n == 0)
        return 0;
    CK(n == (ssize_t)sizeof(*m));
    CK(!(mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)));
    if (fd_out)
        *fd_out = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
        if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
            CK(fd_out);
            *fd_out = fd;
        }
    }
    return m->tag;
}

static void expect(int sock, int tag, struct msg *m, int *fd_out)
{
    struct msg tmp;
    int got = msg_recv(sock, m ? m : &tmp, fd_out);
    if (got != tag) {
        fprintf(stderr, "expected message %d, got %d\n", tag, got);
        _exit(1);
    }
}

/* Blocks until the peer closes its end (it exited or died). */
static void wait_peer_gone(int sock)
{
    struct msg m;
    while (msg_recv(sock, &m, NULL) != 0) {
    }
}

/* ---- parent side: start and reap children ------------------------------------------ */

typedef void (*child_fn)(int sock, const void *arg);

struct kid {
    pid_t pid;
    int err; /* read end of the child's stderr */
};

static struct kid kid_start(child_fn fn, int sock, int close_in_child, const void *arg)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    fflush(NULL);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(98);
        struct rlimit nocore = { 0, 0 };
        setrlimit(RLIMIT_CORE, &nocore);
        dup2(p[1], STDERR_FILENO);
        close(p[0]);
        close(p[1]);
        if (close_in_child >= 0)
            close(close_in_child);
        fn(sock, arg);
        exit(0);
    }
    close(p[1]);
    return (struct kid){ .pid = pid, .err = p[0] };
}

/* Waits for a child; it must exit 0, or die of expect_sig with expect_text on
 * its stderr. Returns false (after printing why) when it did not. */
static bool kid_reap(struct kid k, int expect_sig, const char *expect_text)
{
    double deadline = now_ms() + 30000 * timeout_scale();
    int status = 0;
    pid_t r;
    while ((r = waitpid(k.pid, &status, WNOHANG)) == 0 && now_ms() < deadline)
        sleep_ms(2);
    bool timed_out = r == 0;
    if (timed_out) {
        kill(k.pid, SIGKILL);
        waitpid(k.pid, &status, 0);
    }
    char out[8192];
    size_t len = 0;
    ssize_t n;
    fcntl(k.err, F_SETFL, O_NONBLOCK);
    while (len < sizeof(out) - 1 && (n = read(k.err, out + len, sizeof(out) - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = '\0';
    close(k.err);

    bool ok;
    if (timed_out)
        ok = false;
    else if (expect_sig)
        ok = WIFSIGNALED(status) && WTERMSIG(status) == expect_sig &&
             (!expect_text || strstr(out, expect_text));
    else
        ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok)
        print_error("child %d: %s (status 0x%x; wanted %s%s%s), its stderr:\n%s\n", (int)k.pid,
                    timed_out ? "timed out" : "ended unexpectedly", status,
                    expect_sig ? strsignal(expect_sig) : "exit 0",
                    expect_text ? " with " : "", expect_text ? expect_text : "", out);
    return ok;
}

/* Runs a producer and a consumer connected by a socketpair. */
static void run_pair(child_fn producer, const void *parg, int psig, const char *ptext,
                     child_fn consumer, const void *carg, int csig, const char *ctext)
{
    int n0 = count_fds();
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct kid p = kid_start(producer, sv[0], sv[1], parg);
    struct kid c = kid_start(consumer, sv[1], sv[0], carg);
    close(sv[0]);
    close(sv[1]);
    bool pok = kid_reap(p, psig, ptext);
    bool cok = kid_reap(c, csig, ctext);
    assert_true(pok);
    assert_true(cok);
    assert_int_equal(count_fds(), n0);
}

static void run_one(child_fn fn, const void *arg, int sig, const char *text)
{
    int n0 = count_fds();
    struct kid k = kid_start(fn, -1, -1, arg);
    assert_true(kid_reap(k, sig, text));
    assert_int_equal(count_fds(), n0);
}

/* ==== 1. IPC memory: bit-exact both ways ========================================== */

#define RT_SIZE ((size_t)1000003) /* odd on purpose */

static void rt_producer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    unsigned char *buf = malloc(RT_SIZE), *back = malloc(RT_SIZE);
    CK(buf && back);
    pattern(buf, RT_SIZE, 1);
    void *d;
    CKC(cudaMalloc(&d, RT_SIZE));
    CKC(cudaMemcpy(d, buf, RT_SIZE, cudaMemcpyHostToDevice));
    CKC(cudaDeviceSynchronize());

    struct msg m = { .size = RT_SIZE };
    cudaIpcMemHandle_t inner;
    CKC(cudaIpcGetMemHandle(&m.mh, d));
    /* An interior pointer names the whole allocation. */
    CKC(cudaIpcGetMemHandle(&inner, (char *)d + 12345));
    CK(memcmp(&inner, &m.mh, sizeof(inner)) == 0);
    CK(fakecuda_ipc_mem_handle_pid(&m.mh) == getpid());

    /* CUDA refuses a handle in the process that made it. */
    void *self_open;
    CKE(cudaIpcOpenMemHandle(&self_open, m.mh, cudaIpcMemLazyEnablePeerAccess),
        cudaErrorDeviceUninitialized);
    CKE(cudaPeekAtLastError(), cudaErrorDeviceUninitialized);
    CKE(cudaGetLastError(), cudaErrorDeviceUninitialized);
    CKC(cudaGetLastError());

    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_DONE, NULL, NULL);

    /* The consumer wrote 0xEE over [100, 300). */
    CKC(cudaMemcpy(back, d, RT_SIZE, cudaMemcpyDeviceToHost));
    memset(buf + 100, 0xEE, 200);
    CK(memcmp(back, buf, RT_SIZE) == 0);
    CK(fakecuda_mem_importers(d) == 0);

    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.ipc_get_mem_calls == 2 && st.live_allocations == 1);
    CKC(cudaFree(d));
    fakecuda_get_stats(&st);
    CK(st.live_allocations == 0);
    free(buf);
    free(back);
    CK(count_fds() == n0);
}

static void rt_consumer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    struct msg m;
    expect(sock, T_HANDLES, &m, NULL);
    unsigned char *buf = malloc(m.size), *want = malloc(m.size);
    CK(buf && want);
    pattern(want, m.size, 1);

    void *p, *again;
    CKC(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess));
    CKE(cudaIpcOpenMemHandle(&again, m.mh, cudaIpcMemLazyEnablePeerAccess),
        cudaErrorAlreadyMapped);
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.ipc_open_mem_calls == 2 && st.ipc_mem_open_now == 1);

    CUdeviceptr base;
    size_t size;
    CKD(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p + 777));
    CK(base == (CUdeviceptr)(uintptr_t)p && size == m.size);
    struct cudaPointerAttributes pa;
    CKC(cudaPointerGetAttributes(&pa, (char *)p + 10));
    CK(pa.type == cudaMemoryTypeDevice && pa.device == 0);
    int capable = -1;
    CKD(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                              (CUdeviceptr)(uintptr_t)p));
    CK(capable == 0); /* an imported mapping cannot be exported again */

    CKC(cudaMemcpy(buf, p, m.size, cudaMemcpyDeviceToHost));
    CK(memcmp(buf, want, m.size) == 0);

    CKC(cudaMemset((char *)p + 100, 0xEE, 200));
    CKC(cudaDeviceSynchronize()); /* cudaMemset is asynchronous, as on CUDA */
    CKC(cudaIpcCloseMemHandle(p));
    fakecuda_get_stats(&st);
    CK(st.ipc_mem_open_now == 0 && st.ipc_close_mem_calls == 1);
    CKE(cudaIpcCloseMemHandle(p), cudaErrorInvalidValue);
    msg_send(sock, T_DONE, NULL, -1);
    free(buf);
    free(want);
    CK(count_fds() == n0);
}

static void test_ipc_memory_roundtrip(void **state)
{
    (void)state;
    run_pair(rt_producer, NULL, 0, NULL, rt_consumer, NULL, 0, NULL);
}

/* ==== 2. Stream-ordered handoff through an IPC event ============================== */

#define EV_SIZE ((size_t)1 << 20)

static unsigned slow_delay_us(void)
{
    return (unsigned)(300000 * timeout_scale());
}

static void ev_producer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    fakecuda_set_delay_us(1000);
    cudaStream_t s;
    void *d;
    cudaEvent_t ev;
    CKC(cudaStreamCreate(&s));
    CKC(cudaMalloc(&d, EV_SIZE));
    CKC(cudaMemset(d, 0, EV_SIZE));
    CKC(cudaDeviceSynchronize());
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));

    /* A slow "kernel": the host must not wait for it. */
    fakecuda_set_delay_us(slow_delay_us());
    double t0 = now_ms();
    CKC(cudaMemsetAsync(d, 0x5A, EV_SIZE, s));
    CKC(cudaEventRecord(ev, s));
    CK(now_ms() - t0 < 100);
    CKE(cudaEventQuery(ev), cudaErrorNotReady);

    struct msg m = { .size = EV_SIZE };
    CKC(cudaIpcGetMemHandle(&m.mh, d));
    CKC(cudaIpcGetEventHandle(&m.eh, ev));
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_DONE, NULL, NULL);

    CKC(cudaEventSynchronize(ev));
    CKC(cudaEventQuery(ev));
    CKC(cudaEventDestroy(ev));
    CKC(cudaStreamDestroy(s));
    CKC(cudaFree(d));
    CK(count_fds() == n0);
}

static void ev_consumer(int sock, const void *arg)
{
    bool wait = *(const bool *)arg;
    int n0 = count_fds();
    fakecuda_set_delay_us(1000);
    struct msg m;
    expect(sock, T_HANDLES, &m, NULL);
    void *p;
    cudaEvent_t ev;
    cudaStream_t cs;
    unsigned char *host;
    CKC(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess));
    CKC(cudaIpcOpenEventHandle(&ev, m.eh));
    CKC(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));
    CKC(cudaMallocHost((void **)&host, m.size));
    memset(host, 0x11, m.size);

    /* The producer's write is still queued behind its slow stream. */
    CKE(cudaEventQuery(ev), cudaErrorNotReady);
    double t0 = now_ms();
    if (wait) {
        CKC(cudaStreamWaitEvent(cs, ev, 0));
        CK(now_ms() - t0 < 100); /* the host never waits */
    }
    CKC(cudaMemcpyAsync(host, p, m.size, cudaMemcpyDeviceToHost, cs));
    CKC(cudaStreamSynchronize(cs));
    if (wait) {
        CK(all_bytes(host, m.size, 0x5A));
        CK(now_ms() - t0 > slow_delay_us() / 3000.0); /* it really waited */
    } else {
        /* No wait: the copy ran before the producer's write landed. */
        CK(all_bytes(host, m.size, 0x00));
        CKC(cudaEventSynchronize(ev));
        CKC(cudaMemcpy(host, p, m.size, cudaMemcpyDeviceToHost));
        CK(all_bytes(host, m.size, 0x5A));
    }
    CKC(cudaEventQuery(ev));

    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.ipc_events_open_now == 1 && st.stream_wait_event_calls == (wait ? 1u : 0u));
    CKC(cudaEventDestroy(ev));
    CKC(cudaStreamDestroy(cs));
    CKC(cudaFreeHost(host));
    CKC(cudaIpcCloseMemHandle(p));
    fakecuda_get_stats(&st);
    CK(st.ipc_events_open_now == 0 && st.live_events == 0 && st.live_streams == 0);
    msg_send(sock, T_DONE, NULL, -1);
    CK(count_fds() == n0);
}

static void test_ipc_event_wait_orders_consumer(void **state)
{
    (void)state;
    static const bool wait = true;
    run_pair(ev_producer, NULL, 0, NULL, ev_consumer, &wait, 0, NULL);
}

static void test_ipc_no_wait_sees_stale_data(void **state)
{
    (void)state;
    static const bool wait = false;
    run_pair(ev_producer, NULL, 0, NULL, ev_consumer, &wait, 0, NULL);
}

/* ==== 3. Refusals ========================================================================= */

static void ref_producer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    void *d, *pool, *x;
    int on_stack = 0;
    cudaEvent_t ev, plain, bad;
    struct msg m = { .size = 4096 };
    CKC(cudaMalloc(&d, m.size));
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CKC(cudaEventCreate(&plain));
    /* cudaEventInterprocess needs cudaEventDisableTiming. */
    CKE(cudaEventCreateWithFlags(&bad, cudaEventInterprocess), cudaErrorInvalidValue);
    CKE(cudaIpcGetEventHandle(&m.eh, plain), cudaErrorInvalidResourceHandle);
    CKC(cudaIpcGetEventHandle(&m.eh, ev));
    CKE(cudaIpcOpenEventHandle(&bad, m.eh), cudaErrorDeviceUninitialized);
    CKC(cudaIpcGetMemHandle(&m.mh, d));
    CKE(cudaIpcOpenMemHandle(&x, m.mh, cudaIpcMemLazyEnablePeerAccess),
        cudaErrorDeviceUninitialized);

    /* Only cudaMalloc memory is exportable. */
    cudaIpcMemHandle_t h;
    CKE(cudaIpcGetMemHandle(&h, &on_stack), cudaErrorInvalidValue);
    CKC(cudaMallocAsync(&pool, 4096, 0));
    CKE(cudaIpcGetMemHandle(&h, pool), cudaErrorInvalidValue);
    int capable = -1;
    CKD(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                              (CUdeviceptr)(uintptr_t)pool));
    CK(capable == 0);
    CKD(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
                              (CUdeviceptr)(uintptr_t)d));
    CK(capable == 1);
    CKC(cudaFreeAsync(pool, 0));

    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_OPENED, NULL, NULL);
    CKC(cudaFree(d));
    CKC(cudaEventDestroy(ev));
    CKC(cudaEventDestroy(plain));
    msg_send(sock, T_FREED, NULL, -1);
    expect(sock, T_DONE, NULL, NULL);
    CKC(cudaDeviceSynchronize());
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.live_allocations == 0 && st.live_events == 0);
    CK(count_fds() == n0);
}

static void ref_consumer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    struct msg m;
    expect(sock, T_HANDLES, &m, NULL);
    void *p, *p2;
    unsigned char byte;
    cudaEvent_t ev;
    CKC(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess));
    CKE(cudaIpcOpenMemHandle(&p2, m.mh, cudaIpcMemLazyEnablePeerAccess), cudaErrorAlreadyMapped);

    /* The CUDA 13 documented behaviour: same pointer, reference counted. */
    fakecuda_set_ipc_reopen(FAKECUDA_REOPEN_REFCOUNT);
    CKC(cudaIpcOpenMemHandle(&p2, m.mh, cudaIpcMemLazyEnablePeerAccess));
    CK(p2 == p);
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.ipc_mem_open_now == 1);
    CKC(cudaIpcCloseMemHandle(p));
    CKC(cudaMemcpy(&byte, p, 1, cudaMemcpyDeviceToHost)); /* still mapped */
    CKC(cudaIpcCloseMemHandle(p2));
    CKE(cudaIpcCloseMemHandle(p), cudaErrorInvalidValue);
    fakecuda_reset();

    cudaIpcMemHandle_t junk;
    memset(&junk, 0, sizeof(junk));
    CKE(cudaIpcOpenMemHandle(&p, junk, 0), cudaErrorInvalidValue);
    CKE(cudaIpcOpenMemHandle(&p, m.mh, 0x80), cudaErrorInvalidValue);

    CKC(cudaIpcOpenEventHandle(&ev, m.eh));
    CK(fakecuda_event_importers(ev) == 0); /* counts others than us */
    CKE(cudaIpcGetEventHandle(&m.eh, ev), cudaErrorInvalidResourceHandle);
    CKC(cudaEventDestroy(ev));

    msg_send(sock, T_OPENED, NULL, -1);
    expect(sock, T_FREED, NULL, NULL);
    /* The exporter freed the memory and destroyed the event. */
    CKE(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess), cudaErrorInvalidValue);
    CKE(cudaIpcOpenEventHandle(&ev, m.eh), cudaErrorInvalidValue);
    msg_send(sock, T_DONE, NULL, -1);
    CK(count_fds() == n0);
}

static void test_ipc_refusals(void **state)
{
    (void)state;
    run_pair(ref_producer, NULL, 0, NULL, ref_consumer, NULL, 0, NULL);
}

/* ==== 4. VMM: refused by legacy IPC, shared as a POSIX fd ========================== */

static CUmemAllocationProp vmm_prop(CUmemAllocationHandleType types)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = types;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    return prop;
}

static CUdeviceptr vmm_map(CUmemGenericAllocationHandle h, size_t size)
{
    CUdeviceptr va;
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof(acc));
    acc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc.location.id = 0;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CKD(cuMemAddressReserve(&va, size, 0, 0, 0));
    CKD(cuMemMap(va, size, 0, h, 0));
    CKD(cuMemSetAccess(va, size, &acc, 1));
    return va;
}

static void vmm_producer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    CUmemAllocationProp prop = vmm_prop(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemGenericAllocationHandle h, h_local;
    size_t gran;
    /* The driver API needs cuInit (the runtime would do it implicitly). */
    CKDE(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
         CUDA_ERROR_NOT_INITIALIZED);
    CKD(cuInit(0));
    CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t size = 2 * gran;
    CKDE(cuMemCreate(&h, gran + 1, &prop, 0), CUDA_ERROR_INVALID_VALUE);
    CKD(cuMemCreate(&h, size, &prop, 0));
    CUdeviceptr va = vmm_map(h, size);

    unsigned char *buf = malloc(size);
    CK(buf);
    pattern(buf, size, 7);
    CKC(cudaMemcpy((void *)(uintptr_t)va, buf, size, cudaMemcpyHostToDevice));
    CKC(cudaDeviceSynchronize());

    /* Legacy IPC refuses VMM memory; the pointer attributes say so. */
    cudaIpcMemHandle_t mh;
    CKE(cudaIpcGetMemHandle(&mh, (void *)(uintptr_t)va), cudaErrorInvalidValue);
    int capable = -1;
    unsigned long long types = 0;
    CKD(cuPointerGetAttribute(&capable, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, va + 5));
    CKD(cuPointerGetAttribute(&types, CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, va));
    CK(capable == 0 && (types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    CUdeviceptr base;
    size_t len;
    CKD(cuMemGetAddressRange(&base, &len, va + gran + 3));
    CK(base == va && len == size);

    /* Memory made without a requested handle type cannot be exported. */
    CUmemAllocationProp nprop = vmm_prop(CU_MEM_HANDLE_TYPE_NONE);
    int fd = -1;
    CKD(cuMemCreate(&h_local, gran, &nprop, 0));
    CKDE(cuMemExportToShareableHandle(&fd, h_local, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
         CUDA_ERROR_INVALID_VALUE);
    CKD(cuMemRelease(h_local));

    CKD(cuMemExportToShareableHandle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    CK(fd >= 0);
    struct msg m = { .size = size };
    msg_send(sock, T_HANDLES, &m, fd);
    close(fd);

    /* Drop everything: the importer's mapping keeps the memory alive. */
    CKD(cuMemUnmap(va, size));
    CKD(cuMemAddressFree(va, size));
    CKD(cuMemRelease(h));
    CKDE(cuMemRelease(h), CUDA_ERROR_INVALID_VALUE);
    msg_send(sock, T_RELEASED, NULL, -1);
    expect(sock, T_DONE, NULL, NULL);
    free(buf);
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.live_vmm_handles == 0 && st.vmm_export_calls == 1);
    CK(count_fds() == n0);
}

static void vmm_consumer(int sock, const void *arg)
{
    (void)arg;
    int n0 = count_fds();
    struct msg m;
    int fd = -1;
    expect(sock, T_HANDLES, &m, &fd);
    CK(fd >= 0);
    CUmemGenericAllocationHandle h;
    CKD(cuInit(0));
    CKD(cuMemImportFromShareableHandle(&h, (void *)(intptr_t)fd,
                                       CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR));
    close(fd);
    CUdeviceptr va = vmm_map(h, m.size);
    expect(sock, T_RELEASED, NULL, NULL);

    unsigned char *buf = malloc(m.size), *want = malloc(m.size);
    CK(buf && want);
    pattern(want, m.size, 7);
    CKC(cudaMemcpy(buf, (void *)(uintptr_t)va, m.size, cudaMemcpyDeviceToHost));
    CK(memcmp(buf, want, m.size) == 0);

    CKD(cuMemUnmap(va, m.size));
    CKD(cuMemAddressFree(va, m.size));
    CKD(cuMemRelease(h));
    free(buf);
    free(want);
    msg_send(sock, T_DONE, NULL, -1);
    CK(count_fds() == n0);
}

static void test_vmm_refused_by_ipc_shared_by_fd(void **state)
{
    (void)state;
    run_pair(vmm_producer, NULL, 0, NULL, vmm_consumer, NULL, 0, NULL);
}

/* ==== 5. CUDA_VISIBLE_DEVICES remaps ordinals; UUIDs stay ========================== */

struct vis_arg {
    const char *visible; /* NULL: unset */
    const char *seed;    /* NULL: unset */
};

static void vis_env(const struct vis_arg *a)
{
    setenv("FAKECUDA_DEVICES", "3", 1);
    if (a->visible)
        setenv("CUDA_VISIBLE_DEVICES", a->visible, 1);
    else
        unsetenv("CUDA_VISIBLE_DEVICES");
    if (a->seed)
        setenv("FAKECUDA_UUID_SEED", a->seed, 1);
    else
        unsetenv("FAKECUDA_UUID_SEED");
}

/* Reports its device count and UUIDs (runtime and driver must agree). */
static void vis_report(int sock, const void *arg)
{
    vis_env(arg);
    struct msg m;
    memset(&m, 0, sizeof(m));
    CKC(cudaGetDeviceCount(&m.count));
    CK(m.count <= 4);
    for (int i = 0; i < m.count; i++) {
        struct cudaDeviceProp prop;
        CUuuid u;
        CUdevice dev;
        CKC(cudaGetDeviceProperties(&prop, i));
        CKD(cuDeviceGet(&dev, i));
        CKD(cuDeviceGetUuid(&u, dev));
        CK(memcmp(u.bytes, prop.uuid.bytes, 16) == 0);
        memcpy(m.uuid[i], prop.uuid.bytes, 16);
    }
    struct cudaDeviceProp prop;
    CKE(cudaGetDeviceProperties(&prop, m.count), cudaErrorInvalidDevice);
    CKE(cudaSetDevice(m.count), cudaErrorInvalidDevice);
    msg_send(sock, T_DEVICES, &m, -1);
}

static struct msg vis_query(const char *visible, const char *seed)
{
    int sv[2];
    struct msg m;
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct vis_arg a = { visible, seed };
    struct kid k = kid_start(vis_report, sv[1], sv[0], &a);
    close(sv[1]);
    struct pollfd pfd = { .fd = sv[0], .events = POLLIN };
    assert_int_equal(poll(&pfd, 1, (int)(20000 * timeout_scale())), 1);
    ssize_t n = recv(sv[0], &m, sizeof(m), 0);
    close(sv[0]);
    assert_true(kid_reap(k, 0, NULL));
    assert_int_equal(n, sizeof(m));
    assert_int_equal(m.tag, T_DEVICES);
    return m;
}

/* A producer that sees only physical device 2 allocates on its ordinal 0; a
 * consumer that sees all three finds the memory on its ordinal 2, and the
 * UUIDs agree. */
static void vis_producer(int sock, const void *arg)
{
    (void)arg;
    struct vis_arg a = { "2", NULL };
    vis_env(&a);
    struct msg m = { .size = 64 };
    void *d;
    int count;
    struct cudaDeviceProp prop;
    CKC(cudaGetDeviceCount(&count));
    CK(count == 1);
    CKC(cudaGetDeviceProperties(&prop, 0));
    memcpy(m.uuid[0], prop.uuid.bytes, 16);
    CKC(cudaMalloc(&d, m.size));
    CKC(cudaIpcGetMemHandle(&m.mh, d));
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_DONE, NULL, NULL);
    CKC(cudaFree(d));
}

static void vis_consumer(int sock, const void *arg)
{
    struct vis_arg a = { arg, NULL };
    vis_env(&a);
    struct msg m;
    expect(sock, T_HANDLES, &m, NULL);
    void *p;
    struct cudaPointerAttributes pa;
    struct cudaDeviceProp prop;
    int ordinal = -1;
    CUdevice dev;
    CKC(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess));
    CKC(cudaPointerGetAttributes(&pa, p));
    CKD(cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, (CUdeviceptr)(uintptr_t)p));
    CK(pa.type == cudaMemoryTypeDevice && pa.device == ordinal);
    CKC(cudaGetDeviceProperties(&prop, pa.device));
    CK(memcmp(prop.uuid.bytes, m.uuid[0], 16) == 0);
    CKD(cuDeviceGet(&dev, pa.device));
    CK(strcmp(arg, "0,1,2") != 0 || pa.device == 2);
    CK(strcmp(arg, "2,0") != 0 || pa.device == 0);
    CKC(cudaIpcCloseMemHandle(p));
    msg_send(sock, T_DONE, NULL, -1);
}

static void test_visible_devices_remap_ordinals(void **state)
{
    (void)state;
    struct msg all = vis_query(NULL, NULL);
    assert_int_equal(all.count, 3);
    assert_memory_not_equal(all.uuid[0], all.uuid[1], 16);
    assert_memory_not_equal(all.uuid[1], all.uuid[2], 16);
    assert_memory_not_equal(all.uuid[0], all.uuid[2], 16);

    struct msg again = vis_query(NULL, NULL); /* fixed, not random */
    assert_memory_equal(again.uuid, all.uuid, 3 * 16);

    struct msg rev = vis_query("2,0", NULL);
    assert_int_equal(rev.count, 2);
    assert_memory_equal(rev.uuid[0], all.uuid[2], 16);
    assert_memory_equal(rev.uuid[1], all.uuid[0], 16);

    /* The list stops at the first invalid entry, as with real CUDA. */
    struct msg cut = vis_query("1,bogus,0", NULL);
    assert_int_equal(cut.count, 1);
    assert_memory_equal(cut.uuid[0], all.uuid[1], 16);

    /* A "GPU-" UUID prefix selects a device. */
    char sel[32];
    snprintf(sel, sizeof(sel), "GPU-%02x%02x%02x%02x", all.uuid[2][0], all.uuid[2][1],
             all.uuid[2][2], all.uuid[2][3]);
    struct msg byuuid = vis_query(sel, NULL);
    assert_int_equal(byuuid.count, 1);
    assert_memory_equal(byuuid.uuid[0], all.uuid[2], 16);

    struct msg other = vis_query(NULL, "another-machine");
    assert_int_equal(other.count, 3);
    assert_memory_not_equal(other.uuid[0], all.uuid[0], 16);

    run_pair(vis_producer, NULL, 0, NULL, vis_consumer, "0,1,2", 0, NULL);
    run_pair(vis_producer, NULL, 0, NULL, vis_consumer, "2,0", 0, NULL);
}

/* ==== 6. Streams, copies and pointer queries in one process ======================== */

struct order_log {
    int n;
    int seen[8];
};

static struct order_log olog;
static volatile int flag_a, gate;
static volatile unsigned char seen_byte;
static const unsigned char *watch;

static void log1(void *p) { olog.seen[olog.n++] = (int)(intptr_t)p; }
static void set_flag_a(void *p) { (void)p; flag_a = 1; }
static void read_flag_a(void *p) { *(int *)p = flag_a; }
static void peek(void *p) { (void)p; seen_byte = watch[0]; }
static void open_gate(void *p) { (void)p; gate = 1; }
static void wait_gate(void *p)
{
    double until = now_ms() + 3000 * timeout_scale();
    while (!gate && now_ms() < until)
        sleep_ms(1);
    *(int *)p = gate;
}

static void streams_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    int n0 = count_fds();
    const size_t n = 4096;
    unsigned char host[4096], back[4096];
    unsigned char *d;
    cudaStream_t s, s2, nb;
    cudaEvent_t ev;
    fakecuda_set_delay_us(50000);
    CK(fakecuda_get_delay_us() == 50000);
    CKC(cudaMalloc((void **)&d, n));
    CKC(cudaStreamCreate(&s));
    CKC(cudaStreamCreate(&s2));
    CKC(cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking));

    /* Asynchronous: the memset lands later; a host function sees the old bytes. */
    CKC(cudaMemset(d, 0, n));
    CKC(cudaDeviceSynchronize());
    watch = d;
    double t0 = now_ms();
    CKC(cudaLaunchHostFunc(s, peek, NULL));
    CKC(cudaMemsetAsync(d, 7, n, s));
    CK(now_ms() - t0 < 40);
    CKE(cudaStreamQuery(s), cudaErrorNotReady);
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    CKC(cudaEventRecord(ev, s));
    /* s2 waits on the event: its copy sees the memset. */
    CKC(cudaStreamWaitEvent(s2, ev, 0));
    CKC(cudaMemcpyAsync(back, d, n, cudaMemcpyDeviceToHost, s2)); /* pageable: returns when done */
    CK(all_bytes(back, n, 7));
    CK(seen_byte == 0);
    CK(now_ms() - t0 >= 100);
    CKC(cudaStreamQuery(s));
    CKC(cudaEventQuery(ev));

    fakecuda_set_delay_us(2000);
    /* In-order execution of one stream. */
    for (int i = 1; i <= 3; i++)
        CKC(cudaLaunchHostFunc(s, log1, (void *)(intptr_t)i));
    CKC(cudaStreamSynchronize(s));
    CK(olog.n == 3 && olog.seen[0] == 1 && olog.seen[1] == 2 && olog.seen[2] == 3);

    /* Legacy default stream: a blocking stream waits for it ... */
    int got_a = -1;
    fakecuda_set_delay_us(30000);
    CKC(cudaLaunchHostFunc(0, set_flag_a, NULL));
    fakecuda_set_delay_us(0);
    CKC(cudaLaunchHostFunc(s, read_flag_a, &got_a));
    CKC(cudaDeviceSynchronize());
    CK(got_a == 1);
    /* ... a non-blocking stream does not. */
    int gate_seen = -1;
    CKC(cudaLaunchHostFunc(cudaStreamLegacy, wait_gate, &gate_seen));
    CKC(cudaLaunchHostFunc(nb, open_gate, NULL));
    CKC(cudaDeviceSynchronize());
    CK(gate_seen == 1);
    /* The per-thread default stream. */
    CKC(cudaMemsetAsync(d, 9, n, cudaStreamPerThread));
    CKC(cudaStreamSynchronize(cudaStreamPerThread));
    CKC(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
    CK(all_bytes(back, n, 9));

    /* A pageable source is staged: changing it after the call is harmless. */
    fakecuda_set_delay_us(20000);
    memset(host, 3, n);
    CKC(cudaMemcpy(d, host, n, cudaMemcpyHostToDevice));
    memset(host, 4, n);
    CKC(cudaMemcpy(back, d, n, cudaMemcpyDeviceToHost));
    CK(all_bytes(back, n, 3));
    fakecuda_set_delay_us(1000);

    /* Fault injection: the 2nd device-to-host copy from now fails, once;
     * host-to-device copies do not count. */
    fakecuda_fail_d2h(2);
    CKC(cudaMemcpy(d, host, 16, cudaMemcpyHostToDevice));
    CKC(cudaMemcpy(back, d, 16, cudaMemcpyDeviceToHost));
    CKE(cudaMemcpyAsync(back, d, 16, cudaMemcpyDefault, nb), cudaErrorLaunchFailure);
    CKE(cudaGetLastError(), cudaErrorLaunchFailure);
    CKC(cudaMemcpy(back, d, 16, cudaMemcpyDeviceToHost));
    fakecuda_fail_d2h(0);

    /* Argument checks, last error, error strings. */
    CKE(cudaMemcpy(d, d + 1, 16, cudaMemcpyHostToDevice), cudaErrorInvalidValue);
    CKE(cudaMemcpy(back, d + n - 8, 16, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
    CKE(cudaMemcpy(back, d, 16, (enum cudaMemcpyKind)7), cudaErrorInvalidMemcpyDirection);
    CKE(cudaMemset(host, 0, 16), cudaErrorInvalidValue);
    CKE(cudaPeekAtLastError(), cudaErrorInvalidValue);
    CKE(cudaGetLastError(), cudaErrorInvalidValue);
    CKC(cudaGetLastError());
    CKE(cudaFree(d + 1), cudaErrorInvalidValue);
    CK(strcmp(cudaGetErrorString(cudaErrorInvalidValue), "invalid argument") == 0);
    CK(strcmp(cudaGetErrorName(cudaErrorAlreadyMapped), "cudaErrorAlreadyMapped") == 0);
    CK(strcmp(cudaGetErrorString((cudaError_t)12345), "unrecognized error code") == 0);
    const char *str = NULL;
    CKD(cuGetErrorString(CUDA_ERROR_NOT_FOUND, &str));
    CK(str && strcmp(str, "named symbol not found") == 0);
    CKDE(cuGetErrorString((CUresult)12345, &str), CUDA_ERROR_INVALID_VALUE);

    /* Pointer queries: device memory, registered and plain host memory. */
    CUdeviceptr base;
    size_t size;
    CKD(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)(d + 100)));
    CK(base == (CUdeviceptr)(uintptr_t)d && size == n);
    CKDE(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)host), CUDA_ERROR_NOT_FOUND);
    struct cudaPointerAttributes pa;
    CKC(cudaPointerGetAttributes(&pa, host));
    CK(pa.type == cudaMemoryTypeUnregistered);
    CKC(cudaHostRegister(host, n, cudaHostRegisterDefault));
    CKE(cudaHostRegister(host + 8, 8, cudaHostRegisterDefault), cudaErrorHostMemoryAlreadyRegistered);
    CKC(cudaPointerGetAttributes(&pa, host + 5));
    CK(pa.type == cudaMemoryTypeHost && pa.hostPointer == host + 5);
    unsigned int mtype = 0;
    CKD(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)d));
    CK(mtype == CU_MEMORYTYPE_DEVICE);
    CKDE(cuPointerGetAttribute(&mtype, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, (CUdeviceptr)(uintptr_t)back),
         CUDA_ERROR_INVALID_VALUE);
    CKE(cudaHostUnregister(host + 1), cudaErrorHostMemoryNotRegistered);
    CKC(cudaHostUnregister(host));

    /* Context and device basics. */
    CUcontext ctx = NULL, primary = NULL;
    CUdevice dev = -1;
    int count = 0, cur = -1;
    CKD(cuCtxGetCurrent(&ctx));
    CKD(cuDevicePrimaryCtxRetain(&primary, 0));
    CK(ctx == primary);
    CKD(cuCtxGetDevice(&dev));
    CK(dev == 0);
    CKD(cuDevicePrimaryCtxRelease(0));
    CKC(cudaGetDeviceCount(&count));
    CKC(cudaGetDevice(&cur));
    CK(count == 1 && cur == 0);

    CKC(cudaEventDestroy(ev));
    CKC(cudaStreamDestroy(s));
    CKC(cudaStreamDestroy(s2));
    CKC(cudaStreamDestroy(nb));
    CKE(cudaStreamDestroy(cudaStreamLegacy), cudaErrorInvalidResourceHandle);
    CKC(cudaFree(d));
    struct fakecuda_stats st;
    fakecuda_get_stats(&st);
    CK(st.live_allocations == 0 && st.live_streams == 0 && st.live_events == 0);
    CK(st.host_func_calls == 8);
    fakecuda_reset_stats();
    fakecuda_get_stats(&st);
    CK(st.host_func_calls == 0 && st.memcpy_calls == 0);
    CK(count_fds() == n0);
}

static void test_streams_are_asynchronous(void **state)
{
    (void)state;
    run_one(streams_child, NULL, 0, NULL);
}

/* ==== 7. fork after initialisation ==================================================== */

static void fork_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    int count;
    CKC(cudaGetDeviceCount(&count));
    fflush(NULL);
    pid_t pid = fork();
    CK(pid >= 0);
    if (pid == 0) {
        void *d;
        int c;
        CKE(cudaMalloc(&d, 16), cudaErrorInitializationError);
        CKE(cudaGetDeviceCount(&c), cudaErrorInitializationError);
        CKDE(cuInit(0), CUDA_ERROR_NOT_INITIALIZED);
        CK(strcmp(cudaGetErrorString(cudaErrorInitializationError), "initialization error") == 0);
        _exit(0);
    }
    int status;
    CK(waitpid(pid, &status, 0) == pid);
    CK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    void *d;
    CKC(cudaMalloc(&d, 16)); /* the parent is unaffected */
    CKC(cudaFree(d));
}

static void test_fork_after_init_refuses_cuda(void **state)
{
    (void)state;
    run_one(fork_child, NULL, 0, NULL);
}

/* ==== 8. Traps: undefined behaviour on CUDA aborts loudly ============================= */

static void trap_free_producer(int sock, const void *arg)
{
    (void)arg;
    void *d;
    struct msg m = { .size = 4096 };
    CKC(cudaMalloc(&d, 4096));
    CKC(cudaIpcGetMemHandle(&m.mh, d));
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_OPENED, NULL, NULL);
    CK(fakecuda_mem_importers(d) == 1);
    cudaFree(d); /* traps */
    CK(!"cudaFree returned");
}

static void trap_open_consumer(int sock, const void *arg)
{
    (void)arg;
    struct msg m;
    void *p;
    expect(sock, T_HANDLES, &m, NULL);
    CKC(cudaIpcOpenMemHandle(&p, m.mh, cudaIpcMemLazyEnablePeerAccess));
    msg_send(sock, T_OPENED, NULL, -1);
    wait_peer_gone(sock);
    CKC(cudaIpcCloseMemHandle(p));
}

static void test_trap_free_while_imported(void **state)
{
    (void)state;
    run_pair(trap_free_producer, NULL, SIGABRT, "still have it open",
             trap_open_consumer, NULL, 0, NULL);
}

static void trap_rerecord_producer(int sock, const void *arg)
{
    (void)arg;
    cudaEvent_t ev;
    struct msg m = { .size = 0 };
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CKC(cudaEventRecord(ev, 0));
    CKC(cudaIpcGetEventHandle(&m.eh, ev));
    /* Pinned but nobody has it open: re-recording is allowed. */
    CK(fakecuda_event_pin(ev) == 0);
    CKC(cudaEventRecord(ev, 0));
    CK(fakecuda_event_unpin(ev) == 0);
    CK(fakecuda_event_unpin(ev) == -ERANGE);
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_OPENED, NULL, NULL); /* the consumer opened and pinned it */
    CK(fakecuda_event_importers(ev) == 1);
    cudaEventRecord(ev, 0); /* traps */
    CK(!"cudaEventRecord returned");
}

static void trap_rerecord_consumer(int sock, const void *arg)
{
    (void)arg;
    struct msg m;
    cudaEvent_t ev;
    expect(sock, T_HANDLES, &m, NULL);
    CKC(cudaIpcOpenEventHandle(&ev, m.eh));
    CKC(cudaStreamWaitEvent(0, ev, 0));
    CKC(cudaStreamSynchronize(0));
    CK(fakecuda_ipc_event_pin(&m.eh) == 0); /* by handle, as a test harness would */
    msg_send(sock, T_OPENED, NULL, -1);
    wait_peer_gone(sock);
    CKC(cudaEventDestroy(ev));
}

static void test_trap_rerecord_pinned_event(void **state)
{
    (void)state;
    run_pair(trap_rerecord_producer, NULL, SIGABRT, "re-recorded while pinned",
             trap_rerecord_consumer, NULL, 0, NULL);
}

static void trap_evdestroy_producer(int sock, const void *arg)
{
    (void)arg;
    cudaEvent_t ev;
    struct msg m = { .size = 0 };
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CKC(cudaEventRecord(ev, 0));
    CKC(cudaIpcGetEventHandle(&m.eh, ev));
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_OPENED, NULL, NULL);
    CKC(cudaEventDestroy(ev));
    msg_send(sock, T_FREED, NULL, -1);
    wait_peer_gone(sock);
}

static void trap_evdestroy_consumer(int sock, const void *arg)
{
    (void)arg;
    struct msg m;
    cudaEvent_t ev;
    expect(sock, T_HANDLES, &m, NULL);
    CKC(cudaIpcOpenEventHandle(&ev, m.eh));
    msg_send(sock, T_OPENED, NULL, -1);
    expect(sock, T_FREED, NULL, NULL);
    cudaStreamWaitEvent(0, ev, 0); /* traps */
    CK(!"cudaStreamWaitEvent returned");
}

static void test_trap_event_after_exporter_destroyed(void **state)
{
    (void)state;
    run_pair(trap_evdestroy_producer, NULL, 0, NULL,
             trap_evdestroy_consumer, NULL, SIGABRT, "whose exporter");
}

static void trap_stream_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    cudaStream_t s;
    void *d;
    CKC(cudaMalloc(&d, 64));
    CKC(cudaStreamCreate(&s));
    CKC(cudaStreamDestroy(s));
    cudaMemsetAsync(d, 0, 64, s); /* traps */
    CK(!"cudaMemsetAsync returned");
}

static void test_trap_stream_used_after_destroy(void **state)
{
    (void)state;
    run_one(trap_stream_child, NULL, SIGABRT, "used after cudaStreamDestroy");
}

static void trap_pending_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    static unsigned char host[4096];
    cudaStream_t s;
    void *d;
    CKC(cudaMalloc(&d, sizeof(host)));
    CKC(cudaStreamCreate(&s));
    CKC(cudaHostRegister(host, sizeof(host), cudaHostRegisterDefault));
    fakecuda_set_delay_us(200000);
    CKC(cudaMemcpyAsync(host, d, sizeof(host), cudaMemcpyDeviceToHost, s)); /* pinned: async */
    cudaHostUnregister(host); /* traps: the copy still targets it */
    CK(!"cudaHostUnregister returned");
}

static void test_trap_unregister_with_pending_copy(void **state)
{
    (void)state;
    run_one(trap_pending_child, NULL, SIGABRT, "queued stream operation");
}

static void trap_vmm_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    CUmemAllocationProp prop = vmm_prop(CU_MEM_HANDLE_TYPE_NONE);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va;
    size_t gran;
    char byte = 0;
    CKD(cuInit(0));
    CKD(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    CKD(cuMemCreate(&h, gran, &prop, 0));
    CKD(cuMemAddressReserve(&va, gran, 0, 0, 0));
    CKD(cuMemMap(va, gran, 0, h, 0));
    cudaMemcpy((void *)(uintptr_t)va, &byte, 1, cudaMemcpyHostToDevice); /* traps */
    CK(!"cudaMemcpy returned");
}

static void test_trap_vmm_without_access(void **state)
{
    (void)state;
    run_one(trap_vmm_child, NULL, SIGABRT, "cuMemSetAccess");
}

/* ==== 9. Devices and contexts ===================================================== */

/* Contexts this process created on each of its first 4 devices. */
static void ctx_counts(long out[4])
{
    for (int i = 0; i < 4; i++)
        out[i] = fakecuda_contexts_created(i);
}

#define CK_COUNTS(a, b, c, d)                                                      \
    do {                                                                           \
        long n_[4];                                                                \
        ctx_counts(n_);                                                            \
        if (n_[0] != (a) || n_[1] != (b) || n_[2] != (c) || n_[3] != (d)) {        \
            fprintf(stderr, "%s:%d: contexts created %ld %ld %ld %ld, want %d %d %d %d\n", \
                    __FILE__, __LINE__, n_[0], n_[1], n_[2], n_[3], (a), (b), (c), (d)); \
            _exit(1);                                                              \
        }                                                                          \
    } while (0)

static CUcontext current_ctx(void)
{
    CUcontext c = (CUcontext)(uintptr_t)1;
    CKD(cuCtxGetCurrent(&c));
    return c;
}

struct ctx_thread_arg {
    cudaEvent_t ev;       /* made on device 2 by the main thread */
    CUcontext use;        /* made current by the thread first, when set */
    void *dptr;           /* out: a cudaMalloc of the thread */
    int device;           /* out: cudaGetDevice before any call */
    CUcontext before;     /* out: current context before any call */
    cudaError_t query;    /* out: cudaEventQuery(ev) */
};

/* A thread of a process: nothing is current on it at first. */
static void *ctx_thread(void *p)
{
    struct ctx_thread_arg *a = p;
    a->before = (CUcontext)(uintptr_t)1;
    cuCtxGetCurrent(&a->before);
    cudaGetDevice(&a->device);
    if (a->use)
        cuCtxSetCurrent(a->use);
    if (a->ev)
        a->query = cudaEventQuery(a->ev);
    else
        cudaMalloc(&a->dptr, 64);
    return NULL;
}

static void ctx_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    setenv("FAKECUDA_DEVICES", "4", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    int n, dev = -1, v;
    CUcontext c2, c;
    CUdevice d;
    CUdeviceptr base;
    size_t size;
    struct cudaDeviceProp prop;

    /* What asks about devices creates no context. */
    CKD(cuInit(0));
    CK(current_ctx() == NULL);
    CKC(cudaGetDeviceCount(&n));
    CK(n == 4);
    for (int i = 0; i < n; i++) {
        CKC(cudaGetDeviceProperties(&prop, i));
        CKC(cudaDeviceGetAttribute(&v, cudaDevAttrComputeMode, i));
        CK(v == cudaComputeModeDefault);
    }
    CKC(cudaGetDevice(&dev));
    CK(dev == 0);
    CK_COUNTS(0, 0, 0, 0);
    CK(current_ctx() == NULL);
    /* Driver calls that want a context fail without one. */
    CKDE(cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
    CKDE(cuStreamGetCtx(CU_STREAM_LEGACY, &c), CUDA_ERROR_INVALID_CONTEXT);
    CKDE(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)&n),
         CUDA_ERROR_INVALID_CONTEXT);

    /* cudaSetDevice creates the primary context at once. */
    CKC(cudaSetDevice(2));
    CK_COUNTS(0, 0, 1, 0);
    c2 = current_ctx();
    CK(c2 != NULL);
    CKD(cuCtxGetDevice(&d));
    CK(d == 2);
    CKD(cuStreamGetCtx(CU_STREAM_LEGACY, &c));
    CK(c == c2);
    CKC(cudaSetDevice(2)); /* again: the same context */
    CK_COUNTS(0, 0, 1, 0);

    /* Another thread starts with nothing current and the runtime's
     * device 0: its first runtime call creates device 0's context, even
     * for an event of device 2 (the stray context of an 8-GPU node). */
    cudaEvent_t ev;
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    struct ctx_thread_arg ta = { .ev = ev };
    pthread_t t;
    CK(pthread_create(&t, NULL, ctx_thread, &ta) == 0);
    CK(pthread_join(t, NULL) == 0);
    CK(ta.before == NULL && ta.device == 0 && ta.query == cudaSuccess);
    CK_COUNTS(1, 0, 1, 0);

    /* ...unless it makes the right context current first. */
    struct ctx_thread_arg tb = { .use = c2 };
    CK(pthread_create(&t, NULL, ctx_thread, &tb) == 0);
    CK(pthread_join(t, NULL) == 0);
    CK(tb.before == NULL && tb.dptr != NULL);
    CK_COUNTS(1, 0, 1, 0);
    struct cudaPointerAttributes pa;
    CKC(cudaPointerGetAttributes(&pa, tb.dptr));
    CK(pa.device == 2);
    CKD(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)tb.dptr));
    CK(c == c2);
    CKC(cudaFree(tb.dptr));

    /* Retaining a primary context creates it without making it current;
     * the last release destroys it, and the next retain creates it again. */
    CKD(cuDevicePrimaryCtxRetain(&c, 3));
    CK_COUNTS(1, 0, 1, 1);
    CK(current_ctx() == c2);
    unsigned flags;
    int active;
    CKD(cuDevicePrimaryCtxGetState(3, &flags, &active));
    CK(active == 1);
    CKD(cuDevicePrimaryCtxRelease(3));
    CKD(cuDevicePrimaryCtxGetState(3, &flags, &active));
    CK(active == 0);
    CKDE(cuDevicePrimaryCtxRelease(3), CUDA_ERROR_INVALID_CONTEXT);
    CKD(cuDevicePrimaryCtxRetain(&c, 3));
    CK_COUNTS(1, 0, 1, 2);
    CKD(cuDevicePrimaryCtxRelease(3));
    /* One the runtime initialised stays. */
    CKD(cuDevicePrimaryCtxRetain(&c, 2));
    CKD(cuDevicePrimaryCtxRelease(2));
    CKD(cuDevicePrimaryCtxGetState(2, &flags, &active));
    CK(active == 1);

    /* A context of one's own: current once made; the runtime uses it. */
    CUcontext mine;
    CKD(cuCtxCreate(&mine, NULL, 0, 1));
    CK_COUNTS(1, 1, 1, 2);
    CK(mine != c2 && current_ctx() == mine);
    CKC(cudaGetDevice(&dev));
    CK(dev == 1);
    void *p1;
    CKC(cudaMalloc(&p1, 64));
    CKD(cuPointerGetAttribute(&c, CU_POINTER_ATTRIBUTE_CONTEXT, (CUdeviceptr)(uintptr_t)p1));
    CK(c == mine);
    CKD(cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p1));
    CK(base == (CUdeviceptr)(uintptr_t)p1 && size == 64);
    CKC(cudaFree(p1));
    /* Unbound: nothing current; the runtime falls back to its device. */
    CKD(cuCtxSetCurrent(NULL));
    CK(current_ctx() == NULL);
    CKC(cudaGetDevice(&dev));
    CK(dev == 2);
    CKD(cuCtxSetCurrent(mine));
    CKD(cuCtxDestroy(mine));
    CK(current_ctx() == NULL);
    CKDE(cuCtxSetCurrent(mine), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CKDE(cuCtxDestroy(c2), CUDA_ERROR_INVALID_CONTEXT); /* primary */
    CK_COUNTS(1, 1, 1, 2);
    CKC(cudaSetDevice(2));
    CKC(cudaEventDestroy(ev));
}

static void test_contexts_lazy_and_counted(void **state)
{
    (void)state;
    run_one(ctx_child, NULL, 0, NULL);
}

static void bump(void *p) { ++*(volatile int *)p; }

/* Streams and events belong to a context: each device has its own legacy
 * stream, and an event records only on a stream of its own context. */
static void bound_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    setenv("FAKECUDA_DEVICES", "2", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    cudaStream_t s0, s1;
    cudaEvent_t e0, e1, l0, l1;
    CUcontext c0, c1, c;
    static volatile int ran1;

    CKC(cudaSetDevice(1));
    c1 = current_ctx();
    CKC(cudaStreamCreate(&s1));
    CKC(cudaEventCreateWithFlags(&e1, cudaEventDisableTiming));
    CKC(cudaEventCreateWithFlags(&l1, cudaEventDisableTiming));
    CKC(cudaSetDevice(0));
    c0 = current_ctx();
    CKC(cudaStreamCreate(&s0));
    CKC(cudaEventCreateWithFlags(&e0, cudaEventDisableTiming | cudaEventInterprocess));
    CKC(cudaEventCreateWithFlags(&l0, cudaEventDisableTiming));
    CKD(cuStreamGetCtx(s1, &c));
    CK(c == c1);
    CKD(cuStreamGetCtx(s0, &c));
    CK(c == c0);

    /* Event and stream of device 1, recorded while device 0 is current:
     * fine. An event of device 0 on a stream of device 1: refused. */
    CKC(cudaEventRecord(e1, s1));
    CKE(cudaEventRecord(e0, s1), cudaErrorInvalidResourceHandle);
    CK(cudaGetLastError() == cudaErrorInvalidResourceHandle);
    /* The legacy stream is the current device's. */
    CKE(cudaEventRecord(e1, 0), cudaErrorInvalidResourceHandle);
    CKE(cudaEventRecord(e1, cudaStreamPerThread), cudaErrorInvalidResourceHandle);
    CKC(cudaEventRecord(e0, cudaStreamLegacy));
    cudaGetLastError();
    /* Waits cross devices. */
    CKC(cudaStreamWaitEvent(s0, e1, 0));
    CKC(cudaStreamWaitEvent(s1, e0, 0));

    /* Slow work on device 1's legacy stream holds back only device 1's
     * legacy stream (and its blocking streams), not device 0's. */
    CKC(cudaSetDevice(1));
    fakecuda_set_delay_us(slow_delay_us());
    CKC(cudaLaunchHostFunc(0, bump, (void *)&ran1));
    fakecuda_set_delay_us(0);
    CKC(cudaEventRecord(l1, 0));
    CKC(cudaEventRecord(e1, s1)); /* s1 waits for device 1's legacy stream */
    CKC(cudaSetDevice(0));
    CKC(cudaEventRecord(l0, 0));
    CKC(cudaEventSynchronize(l0));
    CK(ran1 == 0);
    CKE(cudaEventQuery(l1), cudaErrorNotReady);
    CKE(cudaEventQuery(e1), cudaErrorNotReady);
    CKC(cudaEventSynchronize(e1));
    CK(ran1 == 1);
    CKC(cudaStreamDestroy(s0));
    CKC(cudaStreamDestroy(s1));
    CKC(cudaEventDestroy(e0));
    CKC(cudaEventDestroy(e1));
    CKC(cudaEventDestroy(l0));
    CKC(cudaEventDestroy(l1));
}

static void test_streams_and_events_bound_to_device(void **state)
{
    (void)state;
    run_one(bound_child, NULL, 0, NULL);
}

/* Compute modes: device 0 EXCLUSIVE_PROCESS, device 1 PROHIBITED. */
static void excl_env(const void *arg)
{
    setenv("FAKECUDA_DEVICES", "2", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    setenv("FAKECUDA_COMPUTE_MODE", "exclusive_process,prohibited", 1);
    setenv("FAKECUDA_UUID_SEED", arg, 1); /* names the claim: this test's own */
}

static void excl_holder(int sock, const void *arg)
{
    excl_env(arg);
    int v;
    CKC(cudaDeviceGetAttribute(&v, cudaDevAttrComputeMode, 0));
    CK(v == cudaComputeModeExclusiveProcess);
    CKC(cudaSetDevice(0));
    /* Many threads of one process may use it. */
    struct ctx_thread_arg ta = { 0 };
    pthread_t t;
    CK(pthread_create(&t, NULL, ctx_thread, &ta) == 0);
    CK(pthread_join(t, NULL) == 0);
    CK(ta.dptr != NULL);
    CKC(cudaFree(ta.dptr));
    msg_send(sock, T_OPENED, NULL, -1);
    expect(sock, T_DONE, NULL, NULL);
}

static void excl_other(int sock, const void *arg)
{
    excl_env(arg);
    CUcontext c;
    CUdevice d;
    int n, v;
    void *p;
    expect(sock, T_OPENED, NULL, NULL);
    /* Asking about the device is fine; a context on it is not. */
    CKC(cudaGetDeviceCount(&n));
    CK(n == 2);
    CKD(cuDeviceGet(&d, 1));
    CKD(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_COMPUTE_MODE, d));
    CK(v == CU_COMPUTEMODE_PROHIBITED);
    CKE(cudaSetDevice(0), cudaErrorDevicesUnavailable);
    CKE(cudaMalloc(&p, 64), cudaErrorDevicesUnavailable); /* lazy, device 0 */
    CKE(cudaSetDevice(1), cudaErrorDevicesUnavailable);
    CKDE(cuDevicePrimaryCtxRetain(&c, 0), CUDA_ERROR_DEVICE_UNAVAILABLE);
    CKDE(cuCtxCreate(&c, NULL, 0, 0), CUDA_ERROR_DEVICE_UNAVAILABLE);
    CKDE(cuDevicePrimaryCtxRetain(&c, 1), CUDA_ERROR_DEVICE_UNAVAILABLE);
    CK(fakecuda_contexts_created(0) == 0);
    msg_send(sock, T_DONE, NULL, -1);
    /* Once the holder is gone, the device is free. */
    wait_peer_gone(sock);
    double end = now_ms() + 5000 * timeout_scale();
    cudaError_t e;
    while ((e = cudaSetDevice(0)) == cudaErrorDevicesUnavailable && now_ms() < end)
        sleep_ms(5);
    CKC(e);
    CK(fakecuda_contexts_created(0) == 1);
}

static void test_compute_modes(void **state)
{
    (void)state;
    char seed[64];
    snprintf(seed, sizeof(seed), "exclusive-%d", (int)getpid());
    run_pair(excl_holder, seed, 0, NULL, excl_other, seed, 0, NULL);
}

/* A cap on live interprocess events; plain events are not counted. */
static void evcap_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    cudaEvent_t ev[3], extra, plain;
    struct fakecuda_stats st;
    const unsigned ipc = cudaEventDisableTiming | cudaEventInterprocess;
    fakecuda_set_ipc_event_limit(3);
    for (int i = 0; i < 3; i++)
        CKC(cudaEventCreateWithFlags(&ev[i], ipc));
    CKE(cudaEventCreateWithFlags(&extra, ipc), cudaErrorMemoryAllocation);
    CKC(cudaEventCreateWithFlags(&plain, cudaEventDisableTiming));
    fakecuda_get_stats(&st);
    CK(st.live_ipc_events == 3 && st.live_events == 4);
    CKC(cudaEventDestroy(ev[0]));
    CKC(cudaEventCreateWithFlags(&ev[0], ipc));
    CKE(cudaEventCreateWithFlags(&extra, ipc), cudaErrorMemoryAllocation);
    for (int i = 0; i < 3; i++)
        CKC(cudaEventDestroy(ev[i]));
    CKC(cudaEventDestroy(plain));
    fakecuda_get_stats(&st);
    CK(st.live_ipc_events == 0 && st.live_events == 0);
}

static void test_ipc_event_cap(void **state)
{
    (void)state;
    run_one(evcap_child, NULL, 0, NULL);
}

/* A device without read-only host registration refuses the flag. */
static void rohost_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    static unsigned char host[4096];
    int v = -1;
    setenv("FAKECUDA_HOST_REGISTER_READONLY", "0", 1);
    CKC(cudaDeviceGetAttribute(&v, cudaDevAttrHostRegisterReadOnlySupported, 0));
    CK(v == 0);
    CKE(cudaHostRegister(host, sizeof(host), cudaHostRegisterReadOnly), cudaErrorNotSupported);
    CKC(cudaHostRegister(host, sizeof(host), cudaHostRegisterPortable));
    CKC(cudaHostUnregister(host));
}

static void test_host_register_read_only_attribute(void **state)
{
    (void)state;
    run_one(rohost_child, NULL, 0, NULL);
}

/* An imported event whose exporter exited is as dead as a destroyed one. */
static void trap_evexit_producer(int sock, const void *arg)
{
    (void)arg;
    cudaEvent_t ev;
    struct msg m = { .size = 0 };
    CKC(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventInterprocess));
    CKC(cudaEventRecord(ev, 0));
    CKC(cudaIpcGetEventHandle(&m.eh, ev));
    msg_send(sock, T_HANDLES, &m, -1);
    expect(sock, T_OPENED, NULL, NULL);
    /* exits without destroying it */
}

static void trap_evexit_consumer(int sock, const void *arg)
{
    (void)arg;
    struct msg m;
    cudaEvent_t ev;
    expect(sock, T_HANDLES, &m, NULL);
    CKC(cudaIpcOpenEventHandle(&ev, m.eh));
    msg_send(sock, T_OPENED, NULL, -1);
    wait_peer_gone(sock); /* it exited (a zombie counts as gone) */
    cudaStreamWaitEvent(0, ev, 0); /* traps */
    CK(!"cudaStreamWaitEvent returned");
}

static void test_trap_event_after_exporter_exited(void **state)
{
    (void)state;
    run_pair(trap_evexit_producer, NULL, 0, NULL,
             trap_evexit_consumer, NULL, SIGABRT, "exited");
}

/* The driver's twins of the runtime calls want a current context and
 * create none; cuGetProcAddress hands out the header's versioned functions
 * by base name. */
static void drv_child(int sock, const void *arg)
{
    (void)sock;
    (void)arg;
    setenv("FAKECUDA_DEVICES", "2", 1);
    unsetenv("CUDA_VISIBLE_DEVICES");
    CUevent ev;
    CUstream st;
    CUcontext c;
    CUdriverProcAddressQueryResult q;
    void *fn;
    int ord = -1;
    static unsigned char host[4096];

    CKDE(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_ERROR_NOT_INITIALIZED);
    CKD(cuInit(0));
    CKDE(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING), CUDA_ERROR_INVALID_CONTEXT);
    CKDE(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING), CUDA_ERROR_INVALID_CONTEXT);
    CKDE(cuMemHostRegister(host, sizeof(host), CU_MEMHOSTREGISTER_PORTABLE),
         CUDA_ERROR_INVALID_CONTEXT);
    CK(fakecuda_contexts_created(0) == 0 && fakecuda_contexts_created(1) == 0);
    CK(cudaGetLastError() == cudaSuccess);

    CKD(cuDevicePrimaryCtxRetain(&c, 1));
    CKD(cuCtxSetCurrent(c));
    CKD(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS));
    CKD(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
    CKD(cuEventRecord(ev, st));
    CKD(cuEventRecord(ev, CU_STREAM_LEGACY));
    CKD(cuStreamWaitEvent(CU_STREAM_PER_THREAD, ev, 0));
    CKD(cuEventSynchronize(ev));
    CKD(cuEventQuery(ev));
    CUipcEventHandle eh;
    CKD(cuIpcGetEventHandle(&eh, ev));
    CUdeviceptr d;
    CUipcMemHandle mh;
    void *p;
    CKC(cudaMalloc(&p, 4096)); /* in the current context: device 1 */
    d = (CUdeviceptr)(uintptr_t)p;
    CKD(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, d));
    CK(ord == 1);
    CKD(cuIpcGetMemHandle(&mh, d));
    CKDE(cuIpcOpenMemHandle(&d, mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
         CUDA_ERROR_INVALID_CONTEXT); /* our own handle: refused */
    CKD(cuMemcpyDtoDAsync(d, d + 2048, 1024, st));
    CKD(cuStreamSynchronize(st));
    CKD(cuMemHostRegister(host, sizeof(host), CU_MEMHOSTREGISTER_PORTABLE));
    CKD(cuMemHostUnregister(host));
    CKD(cuStreamDestroy(st));
    CKD(cuEventDestroy(ev));
    CK(fakecuda_contexts_created(0) == 0 && fakecuda_contexts_created(1) == 1);
    CKC(cudaFree(p));

    CKD(cuGetProcAddress("cuIpcOpenMemHandle", &fn, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM, &q));
    CK(q == CU_GET_PROC_ADDRESS_SUCCESS && fn == (void *)cuIpcOpenMemHandle);
    CKD(cuGetProcAddress("cuStreamGetCtx", &fn, 12000, 0, &q));
    CK(fn == (void *)cuStreamGetCtx);
    CKD(cuGetProcAddress("cuStreamGetCtx", &fn, CUDA_VERSION, 0, &q));
    CK(fn == NULL); /* a newer ABI the fake does not have */
    CKD(cuGetProcAddress("cudaMalloc", &fn, 12000, 0, &q));
    CK(fn == NULL && q == CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CKDE(cuGetProcAddress("cuInit", &fn, CUDA_VERSION + 10, 0, &q), CUDA_ERROR_INVALID_VALUE);
}

static void test_driver_calls_want_a_context(void **state)
{
    (void)state;
    run_one(drv_child, NULL, 0, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc_memory_roundtrip),
        cmocka_unit_test(test_ipc_event_wait_orders_consumer),
        cmocka_unit_test(test_ipc_no_wait_sees_stale_data),
        cmocka_unit_test(test_ipc_refusals),
        cmocka_unit_test(test_vmm_refused_by_ipc_shared_by_fd),
        cmocka_unit_test(test_visible_devices_remap_ordinals),
        cmocka_unit_test(test_streams_are_asynchronous),
        cmocka_unit_test(test_fork_after_init_refuses_cuda),
        cmocka_unit_test(test_trap_free_while_imported),
        cmocka_unit_test(test_trap_rerecord_pinned_event),
        cmocka_unit_test(test_trap_event_after_exporter_destroyed),
        cmocka_unit_test(test_trap_stream_used_after_destroy),
        cmocka_unit_test(test_trap_unregister_with_pending_copy),
        cmocka_unit_test(test_trap_vmm_without_access),
        cmocka_unit_test(test_contexts_lazy_and_counted),
        cmocka_unit_test(test_streams_and_events_bound_to_device),
        cmocka_unit_test(test_compute_modes),
        cmocka_unit_test(test_ipc_event_cap),
        cmocka_unit_test(test_host_register_read_only_attribute),
        cmocka_unit_test(test_trap_event_after_exporter_exited),
        cmocka_unit_test(test_driver_calls_want_a_context),
    };
    return cmocka_run_group_tests_name("fakecuda", tests, NULL, NULL);
}
