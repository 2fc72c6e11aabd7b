/* daemon — the state the request handlers share. */
#include "daemon.h"

#include <string.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int daemon_init(struct daemon *d, uv_loop_t *loop,
		const struct daemon_limits *limits, uint32_t hello_packet,
		const struct registry_limits *reg,
		const struct registry_ops *rops, const struct conn_ops *cops)
{
	int err;

	memset(d, 0, sizeof(*d));
	d->loop = loop;
	d->limits = limits;
	d->started_ms = now_ms();
	d->conn_limits = (struct conn_limits){
		.max_packet = limits->max_packet,
		.max_fds = limits->max_fds,
		.hello_packet = hello_packet,
		.hello_timeout_ms = limits->hello_timeout_ms,
		.max_output = limits->max_output,
		.max_out_fds = limits->max_out_fds,
	};
	err = board_init(&d->board, limits->board_slots);
	if (err)
		return err;
	err = conn_set_init(&d->conns, loop, cops, &d->conn_limits);
	if (err) {
		board_deinit(&d->board);
		return err;
	}
	registry_init(&d->reg, reg, rops, d);
	closer_init(&d->closer, loop, &d->reg);
	if (d->board.fd >= 0)
		d->reg.board = &d->board;
	return 0;
}

void daemon_deinit(struct daemon *d)
{
	closer_deinit(&d->closer);
	registry_deinit(&d->reg);
	board_deinit(&d->board);
	conn_set_deinit(&d->conns);
}

uint64_t daemon_uptime_ms(const struct daemon *d)
{
	return now_ms() - d->started_ms;
}

/* wire_drop_fn: to the closer, counted until closed. */
static void drop_one(void *ud, int fd)
{
	struct daemon *d = ud;

	if (closer_take(&d->closer, fd) == 0)
		registry_fds_closing(&d->reg, 1);
	else
		close(fd);
}

void daemon_drop_fds(struct daemon *d, int *fds, unsigned n)
{
	wire_drop_fds(fds, n, drop_one, d);
}
