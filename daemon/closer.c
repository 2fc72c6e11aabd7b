/* closer — the daemon's fds of large host buffers, closed off the loop. */
#include "closer.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "registry.h"

void closer_init(struct closer *cl, uv_loop_t *loop, struct registry *reg)
{
	*cl = (struct closer){ .loop = loop, .reg = reg };
	cl->req.data = cl;
}

/* On a pool thread: the kernel frees the pages of each last reference
 * here. */
static void close_work(uv_work_t *req)
{
	struct closer *cl = req->data;

	for (size_t i = 0; i < cl->njob; i++)
		close(cl->job[i]);
}

static void closer_start(struct closer *cl);

static void close_done(uv_work_t *req, int status)
{
	struct closer *cl = req->data;

	(void)status; /* never cancelled: uv_cancel is not called on it */
	registry_fds_closed(cl->reg, cl->njob);
	free(cl->job);
	cl->job = NULL;
	cl->njob = 0;
	cl->busy = 0;
	cl->jobs_done++;
	if (cl->nwait) {
		closer_start(cl);
		return;
	}
	while (cl->idle) {
		struct closer_wait *w = cl->idle;

		cl->idle = w->next;
		w->next = NULL;
		w->fn(w);
	}
}

/* Gives what waits to the pool as one job. */
static void closer_start(struct closer *cl)
{
	cl->job = cl->wait;
	cl->njob = cl->nwait;
	cl->wait = NULL;
	cl->nwait = cl->capwait = 0;
	cl->busy = 1;
	/* Fails only without a work callback. */
	(void)uv_queue_work(cl->loop, &cl->req, close_work, close_done);
}

int closer_take(struct closer *cl, int fd)
{
	if (!cl->loop)
		return -ESHUTDOWN; /* deinited */
	if (cl->nwait == cl->capwait) {
		size_t cap = cl->capwait ? 2 * cl->capwait : 16;
		int *w = realloc(cl->wait, cap * sizeof(*w));

		if (!w)
			return -ENOMEM;
		cl->wait = w;
		cl->capwait = cap;
	}
	cl->wait[cl->nwait++] = fd;
	if (!cl->busy)
		closer_start(cl);
	return 0;
}

int closer_busy(const struct closer *cl)
{
	return cl->busy;
}

uint64_t closer_jobs_done(const struct closer *cl)
{
	return cl->jobs_done;
}

void closer_when_idle(struct closer *cl, struct closer_wait *w)
{
	w->next = cl->idle;
	cl->idle = w;
}

void closer_deinit(struct closer *cl)
{
	for (size_t i = 0; i < cl->nwait; i++)
		close(cl->wait[i]);
	if (cl->nwait)
		registry_fds_closed(cl->reg, cl->nwait);
	free(cl->wait);
	free(cl->job);
	*cl = (struct closer){ 0 };
}
