/* list — List requests: one page of names at a time. */
#include "list.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "encode.h"
#include "reply.h"

static int entry_cmp(const void *a, const void *b)
{
	const struct entry *const *x = a, *const *y = b;

	return strcmp((*x)->name, (*y)->name);
}

/* Max-heap by name of at most cap entries: sift e down from slot i. */
static void heap_down(struct entry **h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, big = i;
		struct entry *t;

		if (l < n && strcmp(h[l]->name, h[big]->name) > 0)
			big = l;
		if (r < n && strcmp(h[r]->name, h[big]->name) > 0)
			big = r;
		if (big == i)
			return;
		t = h[i];
		h[i] = h[big];
		h[big] = t;
		i = big;
	}
}

static void heap_up(struct entry **h, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;
		struct entry *t;

		if (strcmp(h[p]->name, h[i]->name) >= 0)
			return;
		t = h[p];
		h[p] = h[i];
		h[i] = t;
		i = p;
	}
}

void list_request(struct peer *peer, uint64_t id, const Dlshare__List *m)
{
	struct daemon *d = peer->d;
	const char *prefix = m->prefix ? m->prefix : "";
	const char *after = m->after ? m->after : "";
	size_t plen = strlen(prefix), n = 0, matches = 0;
	uint32_t limit = d->limits->list_page;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__ListReply r = DLSHARE__LIST_REPLY__INIT;
	Dlshare__NameInfo *infos = NULL, **ip = NULL;
	struct entry **page, *e, *tmp;

	if (check_prefix(prefix)) {
		reply_err(peer, id, -EINVAL, "list (invalid prefix)", NULL);
		return;
	}
	if (m->has_limit && m->limit > 0 && m->limit < limit)
		limit = m->limit;
	/* One page, not every name: the smallest `limit` names after `after`
	 * are kept in a max-heap while the map is walked once, so a page costs
	 * O(names log page) time and O(page) memory on the loop. */
	page = malloc(limit * sizeof(*page));
	infos = calloc(limit, sizeof(*infos));
	ip = calloc(limit, sizeof(*ip));
	if (!page || !infos || !ip) {
		free(page);
		free(infos);
		free(ip);
		reply_err(peer, id, -ENOMEM, "list", NULL);
		return;
	}
	HASH_ITER(hh, d->reg.names, e, tmp) {
		if (strncmp(e->name, prefix, plen) != 0 ||
		    strcmp(e->name, after) <= 0 ||
		    !registry_may(e, &peer->owner, 4))
			continue;
		matches++;
		if (n < limit) {
			page[n] = e;
			heap_up(page, n++);
		} else if (strcmp(e->name, page[0]->name) < 0) {
			page[0] = e;
			heap_down(page, n, 0);
		}
	}
	qsort(page, n, sizeof(*page), entry_cmp);
	for (size_t i = 0; i < n; i++) {
		encode_name_info(&infos[i], page[i]);
		encode_name_lifetime(&infos[i], &peer->d->reg, page[i]);
		ip[i] = &infos[i];
	}
	r.n_names = n;
	r.names = ip;
	r.has_more = 1;
	r.more = matches > n;
	f.body_case = DLSHARE__FRAME__BODY_LIST_REPLY;
	f.list_reply = &r;
	reply_send(peer, id, &f);
	free(infos);
	free(ip);
	free(page);
}
