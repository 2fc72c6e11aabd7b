/* fork — what fork() does to libdlshare. A client belongs to the process
 * that connected it. A child that inherited one must never use its socket
 * (it is the parent's connection: a request, a Release or a shutdown from
 * the child lands on the parent's), never take its locks (a parent thread
 * may have held them at the fork) and never join its receiver thread (there
 * is none in the child). So a child's copies of the clients' fds are closed
 * as it starts, and every call on an inherited client fails with
 * DLSHARE_EFORK. Writable mappings of store buffers are made with the fork
 * lock held and marked MADV_DONTFORK, so that no child inherits one (the
 * daemon could not write-seal the buffer while it lives); the memfds the
 * library keeps for its writers (to write-seal them itself) are closed in a
 * child as it starts, with the client's fds. Any thread.
 */
#include "internal.h"
#include "chan.h"

#include <errno.h>
#include <sys/mman.h>
#include <unistd.h>

#include <utlist.h>

/* Held around what a fork must not split: a client's fds being made (so
 * that the child knows them all) and a writable mapping being made and
 * marked (so that no child inherits it before it is marked). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
/* The clients connected by this process (not their children's). */
static dlshare_client *clients;
/* Bumped in every child: a client connected under another generation was
 * inherited. */
static atomic_ulong generation;
/* A page the kernel hands a child zeroed, whatever made the child (fork,
 * _Fork, a raw clone without CLONE_VM: MADV_WIPEONFORK, Linux 4.14). Its
 * first word is this process's token, made when it connects its first
 * client; a client connected under another token was inherited. This is
 * the check the pid made, without a system call per check (glibc caches
 * no pid). NULL where the kernel has no MADV_WIPEONFORK: the pid is asked
 * then. */
static atomic_ulong *wipe;
/* The last token made: ordinary memory, so a child inherits it and its
 * own token is larger than any its ancestors made (a grandchild that got
 * its grandparent's pid back still has a token of its own). */
static unsigned long last_token;

static void on_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void on_parent(void)
{
	pthread_mutex_unlock(&lock);
}

/* In the child, which is single-threaded here: only the forking thread
 * exists, and it holds the lock (on_prepare). */
static void on_child(void)
{
	dlshare_client *c, *tmp;

	atomic_fetch_add(&generation, 1);
	DL_FOREACH_SAFE2(clients, c, tmp, fork_next) {
		fork_close_fds(c);
		c->fork_prev = c->fork_next = NULL;
	}
	clients = NULL;
	pthread_mutex_init(&lock, NULL);
}

static void fork_once(void)
{
	void *p = mmap(NULL, (size_t)sysconf(_SC_PAGESIZE),
		       PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);

	if (p != MAP_FAILED &&
	    madvise(p, (size_t)sysconf(_SC_PAGESIZE), MADV_WIPEONFORK) < 0) {
		munmap(p, (size_t)sysconf(_SC_PAGESIZE));
		p = MAP_FAILED;
	}
	if (p != MAP_FAILED)
		wipe = p;
	/* Without handlers (no memory for them) a child still knows an
	 * inherited client by its token (or pid); only its fds stay open
	 * until it disconnects the client or exits. */
	pthread_atfork(on_prepare, on_parent, on_child);
}

void fork_hold(void)
{
	pthread_once(&once, fork_once);
	pthread_mutex_lock(&lock);
}

void fork_unhold(void)
{
	pthread_mutex_unlock(&lock);
}

void fork_add(dlshare_client *c)
{
	c->pid = getpid();
	c->fork_gen = atomic_load(&generation);
	/* Under the lock: one token per process. */
	if (wipe) {
		if (!atomic_load(wipe))
			atomic_store(wipe, ++last_token);
		c->fork_token = atomic_load(wipe);
	}
	DL_APPEND2(clients, c, fork_prev, fork_next);
	c->fork_listed = 1;
}

void fork_del(dlshare_client *c)
{
	if (!c->fork_listed)
		return;
	DL_DELETE2(clients, c, fork_prev, fork_next);
	c->fork_listed = 0;
}

void fork_close_fds(dlshare_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	c->fd = -1;
	c->wake_fd = -1;
	/* The request channel: a child's calls never use it. */
	if (c->chan_efd >= 0)
		close(c->chan_efd);
	c->chan_efd = -1;
	if (c->chan)
		munmap(c->chan, CHAN_BYTES);
	c->chan = NULL;
	/* A child's copies of the writers' memfds: they would keep the
	 * buffers alive as long as the child, after the daemon let go. */
	for (unsigned i = 0; i < c->nseal_fds; i++)
		close(c->seal_fds[i]);
	c->nseal_fds = 0;
}

int fork_keep_fd(dlshare_client *c, int fd)
{
	int kept = 0;

	fork_hold();
	if (c->nseal_fds < CLIENT_SEAL_FDS_MAX) {
		c->seal_fds[c->nseal_fds++] = fd;
		kept = 1;
	}
	fork_unhold();
	return kept;
}

void fork_forget_fd(dlshare_client *c, int fd)
{
	fork_hold();
	for (unsigned i = 0; i < c->nseal_fds; i++)
		if (c->seal_fds[i] == fd) {
			c->seal_fds[i] = c->seal_fds[--c->nseal_fds];
			break;
		}
	fork_unhold();
}

int client_forked(const dlshare_client *c)
{
	/* The generation alone misses a fork without handlers (_Fork, a raw
	 * clone); the pid alone misses a grandchild that got its
	 * grandparent's pid back, the token does not. A process that shares
	 * our memory (a raw clone with CLONE_VM) shares the token too: it
	 * uses the client as a thread would, through the same memory and
	 * locks, which is why the wiped page is the test and not the pid.
	 * wipe was set before any client was connected (fork_hold). */
	if (c->fork_gen != atomic_load_explicit(&generation,
						memory_order_relaxed))
		return 1;
	if (wipe)
		return c->fork_token != atomic_load_explicit(wipe,
							      memory_order_relaxed);
	return c->pid != getpid();
}

int fork_refuse(void)
{
	errmsg_set("the client was created in another process (this one "
		   "is a fork of it): make a new one in the child");
	return DLSHARE_EFORK;
}

void *fork_mmap_writable(size_t size, int fd)
{
	void *p;
	int e = 0;

	fork_hold();
	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p != MAP_FAILED && madvise(p, size, MADV_DONTFORK) < 0) {
		e = errno;
		munmap(p, size);
		p = MAP_FAILED;
	}
	fork_unhold();
	if (e)
		errno = e;
	return p;
}
