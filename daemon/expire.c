/* expire — one timer for every TTL. */
#include "expire.h"

#include "log.h"

static void on_expire(uv_timer_t *t)
{
	struct daemon *d = t->data;
	size_t n;

	d->expire_at = UINT64_MAX;
	n = registry_expire(&d->reg, uv_now(d->loop), EXPIRE_BATCH);
	if (n)
		log_debug("expired %zu name(s) (TTL)", n);
	/* More due: the next turn of the loop, after other peers' I/O. */
	expire_arm(d);
}

void expire_init(struct daemon *d)
{
	uv_timer_init(d->loop, &d->expire);
	d->expire.data = d;
	/* Expiring names is no reason to keep the loop running. */
	uv_unref((uv_handle_t *)&d->expire);
	d->expire_at = UINT64_MAX;
	d->expire_open = 1;
}

void expire_close(struct daemon *d)
{
	if (!d->expire_open)
		return;
	d->expire_open = 0;
	uv_close((uv_handle_t *)&d->expire, NULL);
}

void expire_arm(struct daemon *d)
{
	uint64_t at = registry_next_expiry(&d->reg);
	uint64_t now;

	if (!d->expire_open || at == UINT64_MAX || at >= d->expire_at)
		return;
	now = uv_now(d->loop);
	d->expire_at = at;
	uv_timer_start(&d->expire, on_expire, at > now ? at - now : 0, 0);
}
