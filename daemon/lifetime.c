/* lifetime — names that go by themselves: owned names, deleted when the
 * connection that owns them goes, and names with a TTL, deleted when no
 * version was sealed for that long.
 *
 * Part of the registry (its functions are declared in registry.h, and the
 * registry calls them where an entry is added to, sealed, detached or
 * freed); it keeps the owner's list of owned names and one binary min-heap
 * of the names with a TTL, keyed by when they expire. The daemon wakes on
 * the heap's top with one timer (daemon/expire.c); nothing here scans the
 * name map. Loop thread only.
 */
#include "registry.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint64_t now_of(const struct registry *r)
{
	return r->ops && r->ops->now_ms ? r->ops->now_ms(r->ud) : 0;
}

static void expiry_changed(struct registry *r)
{
	if (r->ops && r->ops->expiry_changed)
		r->ops->expiry_changed(r->ud);
}

/* ---- the heap ------------------------------------------------------------ */

static void heap_put(struct registry *r, uint32_t i, struct entry *e)
{
	r->ttl_heap[i] = e;
	e->life->heap_slot = i + 1;
}

static void heap_up(struct registry *r, uint32_t i)
{
	struct entry *e = r->ttl_heap[i];

	while (i > 0) {
		uint32_t p = (i - 1) / 2;

		if (r->ttl_heap[p]->life->expires_ms <= e->life->expires_ms)
			break;
		heap_put(r, i, r->ttl_heap[p]);
		i = p;
	}
	heap_put(r, i, e);
}

static void heap_down(struct registry *r, uint32_t i)
{
	struct entry *e = r->ttl_heap[i];

	for (;;) {
		uint32_t c = 2 * i + 1;

		if (c >= r->ttl_n)
			break;
		if (c + 1 < r->ttl_n && r->ttl_heap[c + 1]->life->expires_ms <
					   r->ttl_heap[c]->life->expires_ms)
			c++;
		if (e->life->expires_ms <= r->ttl_heap[c]->life->expires_ms)
			break;
		heap_put(r, i, r->ttl_heap[c]);
		i = c;
	}
	heap_put(r, i, e);
}

static void heap_remove(struct registry *r, struct entry *e)
{
	uint32_t i = e->life->heap_slot - 1;
	struct entry *last;

	e->life->heap_slot = 0;
	last = r->ttl_heap[--r->ttl_n];
	if (i == r->ttl_n)
		return;
	heap_put(r, i, last);
	heap_up(r, i);
	heap_down(r, last->life->heap_slot - 1);
}

/* Puts e (which has a lifetime record) in the heap (or moves it) at its
 * expires_ms. Returns 0 or -ENOMEM (e then has no TTL: it lives until
 * deleted). */
static int heap_set(struct registry *r, struct entry *e)
{
	if (e->life->heap_slot) {
		uint32_t i = e->life->heap_slot - 1;

		heap_up(r, i);
		heap_down(r, e->life->heap_slot - 1);
		return 0;
	}
	if (r->ttl_n == r->ttl_cap) {
		uint32_t cap = r->ttl_cap ? r->ttl_cap * 2 : 64;
		struct entry **h = realloc(r->ttl_heap, cap * sizeof(*h));

		if (!h)
			return -ENOMEM;
		r->ttl_heap = h;
		r->ttl_cap = cap;
	}
	heap_put(r, r->ttl_n++, e);
	heap_up(r, r->ttl_n - 1);
	return 0;
}

/* ---- what the registry calls --------------------------------------------- */

int lifetime_check(const struct registry *r, const struct registry_owner *o,
		   const struct entry *e, const struct registry_spec *s,
		   struct refusal *why)
{
	const char *reason;

	if (s->ttl_ms > r->limits.max_ttl_ms) {
		reason = "max-ttl (the longest TTL a name may have)";
		goto refuse;
	}
	if (!e)
		return 0;
	/* Asking to own a name takes it over: only the name's owner uid
	 * may (a restarted producer, or a second connection of it). */
	if (s->owned && o->uid != e->owner_uid) {
		reason = "an owned name belongs to a connection of its owner uid";
		goto refuse_perm;
	}
	/* Anyone else adding to an owned name would see it vanish with a
	 * connection that is not theirs. */
	if (e->life && e->life->owned_by && e->life->owned_by != o &&
	    !s->owned) {
		reason = "the name is owned by another connection; it goes "
			 "when that connection closes";
		goto refuse_perm;
	}
	return 0;
refuse:
	if (why)
		*why = (struct refusal){ reason, METRICS_LIMIT_MAX_TTL };
	return -ERANGE;
refuse_perm:
	if (why)
		*why = (struct refusal){ reason, METRICS_LIMIT_OTHER };
	return -EPERM;
}

/* e is no connection's any more (it has a lifetime record). */
static void owned_unlink(struct entry *e)
{
	struct registry_owner *o = e->life->owned_by;

	if (!o)
		return;
	DL_DELETE2(o->owned, e, life->owprev, life->ownext);
	o->nowned--;
	e->life->owned_by = NULL;
}

/* The TTL s gives e: its own, or for a new name the default. */
static uint32_t spec_ttl(const struct registry *r,
			 const struct registry_spec *s, int fresh)
{
	return s->ttl_ms || !fresh ? s->ttl_ms : r->limits.default_ttl_ms;
}

int lifetime_prepare(const struct registry *r, struct entry *e,
		     const struct registry_spec *s, int fresh)
{
	if (e->life || (!s->owned && !spec_ttl(r, s, fresh)))
		return 0;
	e->life = calloc(1, sizeof(*e->life));
	return e->life ? 0 : -ENOMEM;
}

void lifetime_apply(struct registry *r, struct registry_owner *o,
		    struct entry *e, const struct registry_spec *s, int fresh)
{
	uint32_t ttl = spec_ttl(r, s, fresh);
	struct entry_life *lf = e->life;

	if (s->owned && lf->owned_by != o) {
		owned_unlink(e);
		lf->owned_by = o;
		DL_APPEND2(o->owned, e, life->owprev, life->ownext);
		o->nowned++;
	}
	if (!ttl)
		return;
	/* A new TTL counts from now; a name without a sealed version yet
	 * expires ttl after its creation. */
	lf->ttl_ms = ttl;
	lf->expires_ms = now_of(r) + ttl;
	if (heap_set(r, e))
		lf->ttl_ms = 0;
	else
		expiry_changed(r);
}

void lifetime_sealed(struct registry *r, struct entry *e)
{
	struct entry_life *lf = e->life;

	if (!lf || !lf->ttl_ms || e->detached || !lf->heap_slot || lf->doomed)
		return;
	/* Later, never earlier: the timer needs no news. */
	lf->expires_ms = now_of(r) + lf->ttl_ms;
	heap_down(r, lf->heap_slot - 1);
}

void lifetime_forget(struct registry *r, struct entry *e)
{
	if (!e->life)
		return;
	/* A doomed name goes, by the timer, a new version, a Delete, or its
	 * last version ending with its exporter: counted once, here. */
	if (e->life->doomed)
		r->norphaned++;
	owned_unlink(e);
	if (e->life->heap_slot)
		heap_remove(r, e);
	free(e->life);
	e->life = NULL;
}

void lifetime_owner_drop(struct registry *r, struct registry_owner *o)
{
	int doomed = 0;

	/* Deleting thousands of names here would hold the loop (each closes
	 * its buffers' fds): they become due at once instead, and the
	 * timer deletes them a batch per wakeup. */
	while (o->owned) {
		struct entry *e = o->owned;

		owned_unlink(e);
		e->life->doomed = 1;
		e->life->expires_ms = 0;
		if (!e->life->ttl_ms)
			e->life->ttl_ms = 1;
		if (heap_set(r, e)) {
			/* No room in the heap: now, then. */
			registry_detach(r, e);
			continue;
		}
		doomed = 1;
	}
	if (doomed)
		expiry_changed(r);
}

void lifetime_reap(struct registry *r, const char *name)
{
	struct entry *e = registry_entry(r, name);

	if (e && entry_doomed(e))
		registry_detach(r, e);
}

size_t registry_expire(struct registry *r, uint64_t now, size_t max)
{
	size_t n = 0;

	while (n < max && r->ttl_n && r->ttl_heap[0]->life->expires_ms <= now) {
		struct entry *e = r->ttl_heap[0];

		if (!e->life->doomed)
			r->nexpired++;
		registry_detach(r, e);
		n++;
	}
	return n;
}

uint64_t registry_next_expiry(const struct registry *r)
{
	return r->ttl_n ? r->ttl_heap[0]->life->expires_ms : UINT64_MAX;
}

uint64_t lifetime_left(const struct registry *r, const struct entry *e)
{
	uint64_t now;

	if (!e->life || !e->life->heap_slot || e->life->doomed)
		return UINT64_MAX;
	now = now_of(r);
	return e->life->expires_ms > now ? e->life->expires_ms - now : 0;
}

/* ---- deleting by prefix ----------------------------------------------------- */

int registry_delete_prefix(struct registry *r, struct registry_owner *o,
			   const char *prefix, size_t max, uint64_t *deleted,
			   uint64_t *skipped)
{
	size_t plen = strlen(prefix);
	struct entry *e, *tmp;

	*deleted = *skipped = 0;
	/* One walk of the map, as a List page; detaching e frees at most e
	 * (its versions die with it unless leased), never the next entry. */
	HASH_ITER(hh, r->names, e, tmp) {
		if (strncmp(e->name, prefix, plen) != 0)
			continue;
		if (!registry_may(e, o, 2)) {
			(*skipped)++;
			continue;
		}
		if (*deleted == max)
			return 1;
		registry_detach(r, e);
		(*deleted)++;
	}
	return 0;
}
