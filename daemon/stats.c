/* stats — Stats requests: gauges, counters, quotas. */
#include "stats.h"

#include <string.h>

#include "reply.h"

static uint64_t uid_bytes(const struct uid_usage *u)
{
	return u->host_bytes + u->gpu_bytes;
}

/* used of cap as a fraction; 0 where there is no cap. */
static double share(uint64_t used, uint64_t cap)
{
	return cap && cap != UINT64_MAX ? (double)used / (double)cap : 0.0;
}

/* The quotas of one uid, as the wire says them (0: no limit). */
static void quota_limits(const struct registry *r, Dlshare__QuotaLimits *q)
{
	const struct registry_limits *l = &r->limits;
	uint64_t host, gpu, lhost, lgpu;

	registry_uid_caps(r, &host, &gpu, &lhost, &lgpu);
#define SET(field, v) \
	do { q->has_##field = 1; q->field = (v) == UINT64_MAX ? 0 : (v); } while (0)
	SET(connections, (uint64_t)l->uid_connections);
	SET(names, (uint64_t)l->uid_names);
	SET(leases, (uint64_t)l->uid_leases);
	SET(pending, (uint64_t)l->uid_pending);
	SET(host_bytes, host);
	SET(gpu_bytes, gpu);
	SET(manifest_bytes, l->uid_manifest_bytes);
	SET(leased_host_bytes, lhost);
	SET(leased_gpu_bytes, lgpu);
	SET(open_fds, (uint64_t)l->uid_open_fds);
#undef SET
}

/* How near u is to its nearest quota: the largest share of one. */
static double nearness(const struct uid_usage *u, const Dlshare__QuotaLimits *q)
{
	const double s[] = {
		share(u->owners, q->connections),
		share(u->names, q->names),
		share(u->leases, q->leases),
		share(u->pending, q->pending),
		share(u->host_bytes, q->host_bytes),
		share(u->gpu_bytes, q->gpu_bytes),
		share(u->meta_bytes, q->manifest_bytes),
		share(u->leased_host_bytes, q->leased_host_bytes),
		share(u->leased_gpu_bytes, q->leased_gpu_bytes),
		share(u->fds + u->fds_queued, q->open_fds),
	};
	double max = 0;

	for (size_t i = 0; i < sizeof(s) / sizeof(*s); i++)
		if (s[i] > max)
			max = s[i];
	return max;
}

static void usage_row(Dlshare__UidUsage *row, const struct uid_usage *u)
{
	dlshare__uid_usage__init(row);
	row->uid = (uint32_t)u->uid;
#define SET(field, v) do { row->has_##field = 1; row->field = (v); } while (0)
	SET(connections, u->owners);
	SET(names, u->names);
	SET(leases, u->leases);
	SET(pending, u->pending);
	SET(host_bytes, u->host_bytes);
	SET(gpu_bytes, u->gpu_bytes);
	SET(manifest_bytes, u->meta_bytes);
	SET(leased_host_bytes, u->leased_host_bytes);
	SET(leased_gpu_bytes, u->leased_gpu_bytes);
	SET(open_fds, u->fds + u->fds_queued);
#undef SET
}

/* What a StatsReply's 1.5 part points into; on the stack of
 * stats_request. */
struct stats_counters {
	Dlshare__KindStats kinds[REGISTRY_KINDS], *kindp[REGISTRY_KINDS];
	Dlshare__DeviceStats devs[REGISTRY_DEVICES_MAX + 1];
	Dlshare__DeviceStats *devp[REGISTRY_DEVICES_MAX + 1];
	Dlshare__Counter req[METRICS_REQ_N], *reqp[METRICS_REQ_N];
	Dlshare__Counter err[METRICS_REQ_N * METRICS_CODES];
	Dlshare__Counter *errp[METRICS_REQ_N * METRICS_CODES];
	Dlshare__Counter lim[METRICS_LIMIT_N], *limp[METRICS_LIMIT_N];
	Dlshare__Counter cut[METRICS_CUT_N], *cutp[METRICS_CUT_N];
	Dlshare__QuotaLimits quota;
	Dlshare__UidUsage usage[STATS_UIDS_MAX], *usagep[STATS_UIDS_MAX];
};

static void counter(Dlshare__Counter *c, const char *label, const char *code,
		    uint64_t value)
{
	dlshare__counter__init(c);
	c->label = (char *)label;
	c->code = (char *)code;
	c->value = value;
}

/* The usage rows: up to want uids, nearest a quota first. */
static size_t usage_rows(struct daemon *d, struct stats_counters *s,
			 size_t want)
{
	const struct uid_usage *top[STATS_UIDS_MAX];
	double near[STATS_UIDS_MAX];
	struct uid_usage *u, *utmp;
	size_t n = 0;

	HASH_ITER(hh, d->reg.uids, u, utmp) {
		double x = nearness(u, &s->quota);
		size_t i;

		if (!want || (n == want && x <= near[n - 1]))
			continue;
		if (n < want)
			n++;
		for (i = n - 1; i > 0 && near[i - 1] < x; i--) {
			top[i] = top[i - 1];
			near[i] = near[i - 1];
		}
		top[i] = u;
		near[i] = x;
	}
	for (size_t i = 0; i < n; i++) {
		usage_row(&s->usage[i], top[i]);
		s->usagep[i] = &s->usage[i];
	}
	return n;
}

/* Fills r's 1.5 part from d, pointing into s. */
static void stats_counters(struct daemon *d, const Dlshare__Stats *m,
			   Dlshare__StatsReply *r, struct stats_counters *s)
{
	const struct registry *reg = &d->reg;
	const struct metrics *mt = &d->metrics;
	size_t n = 0, want;

	for (unsigned k = 1; k < REGISTRY_KINDS; k++) {
		dlshare__kind_stats__init(&s->kinds[n]);
		s->kinds[n].kind = (Dlshare__BufferKind)k;
		s->kinds[n].buffers = reg->kind_buffers[k];
		s->kinds[n].bytes = reg->kind_bytes[k];
		s->kindp[n] = &s->kinds[n];
		n++;
	}
	r->n_kinds = n;
	r->kinds = s->kindp;

	n = 0;
	for (unsigned i = 0; i <= REGISTRY_DEVICES_MAX; i++) {
		const struct registry_device *dv = i < REGISTRY_DEVICES_MAX ?
						   &reg->devices[i] :
						   &reg->dev_other;

		if (!dv->buffers)
			continue;
		dlshare__device_stats__init(&s->devs[n]);
		if (i < REGISTRY_DEVICES_MAX) {
			s->devs[n].has_uuid = 1;
			s->devs[n].uuid.data = (uint8_t *)dv->uuid;
			s->devs[n].uuid.len = REGISTRY_UUID_LEN;
		}
		s->devs[n].buffers = dv->buffers;
		s->devs[n].bytes = dv->bytes;
		s->devp[n] = &s->devs[n];
		n++;
	}
	r->n_devices = n;
	r->devices = s->devp;

	for (unsigned i = 0; i < METRICS_REQ_N; i++) {
		counter(&s->req[i], metrics_req_name(i), NULL, mt->requests[i]);
		s->reqp[i] = &s->req[i];
	}
	r->n_requests_by_type = METRICS_REQ_N;
	r->requests_by_type = s->reqp;

	/* Errors: only the rows that happened (most of the table never
	 * does). */
	n = 0;
	for (unsigned i = 0; i < METRICS_REQ_N; i++)
		for (unsigned c = 0; c < METRICS_CODES; c++) {
			if (!mt->errors[i][c])
				continue;
			counter(&s->err[n], metrics_req_name(i),
				metrics_code_name(c), mt->errors[i][c]);
			s->errp[n] = &s->err[n];
			n++;
		}
	r->n_errors = n;
	r->errors = s->errp;

	for (unsigned i = 0; i < METRICS_LIMIT_N; i++) {
		counter(&s->lim[i], metrics_limit_name(i), NULL, mt->limits[i]);
		s->limp[i] = &s->lim[i];
	}
	r->n_limit_hits = METRICS_LIMIT_N;
	r->limit_hits = s->limp;

	for (unsigned i = 0; i < METRICS_CUT_N; i++) {
		counter(&s->cut[i], metrics_cut_name(i), NULL, mt->cut[i]);
		s->cutp[i] = &s->cut[i];
	}
	r->n_cut_off = METRICS_CUT_N;
	r->cut_off = s->cutp;

	r->has_waiting_producers = 1;
	r->waiting_producers = d->nqwaiting;
	r->has_accepted = 1;
	r->accepted = d->conns.next_id;

	dlshare__quota_limits__init(&s->quota);
	quota_limits(reg, &s->quota);
	r->quota_limits = &s->quota;
	want = m->has_usage_uids ? m->usage_uids : 0;
	if (want > STATS_UIDS_MAX)
		want = STATS_UIDS_MAX;
	r->n_usage = usage_rows(d, s, want);
	r->usage = s->usagep;
}

void stats_request(struct peer *peer, uint64_t id, const Dlshare__Stats *m)
{
	struct daemon *d = peer->d;
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__StatsReply r = DLSHARE__STATS_REPLY__INIT;
	Dlshare__UidStats rows[STATS_UIDS_MAX], *rowp[STATS_UIDS_MAX];
	struct uid_usage *top[STATS_UIDS_MAX], *u, *utmp;
	struct stats_counters *s = NULL;
	struct stats_counters counters;
	size_t n = 0, want;

	r.connections = d->conns.n;
	r.names = d->reg.nnames;
	r.versions = d->reg.nversions;
	r.leases = d->reg.nleases;
	r.buffers = d->reg.nbuffers;
	r.bytes = d->reg.bytes;
	r.parked = d->nparked;
	r.requests = d->requests;
	r.uptime_ms = daemon_uptime_ms(d);
	r.has_manifest_bytes = 1;
	r.manifest_bytes = d->reg.meta_bytes;
	r.has_expired = 1;
	r.expired = d->reg.nexpired;
	r.has_orphaned = 1;
	r.orphaned = d->reg.norphaned;
	/* 1.4: the uids holding the most bytes, up to what was asked. */
	r.has_nuids = 1;
	r.nuids = (uint32_t)HASH_COUNT(d->reg.uids);
	want = m->has_max_uids ? m->max_uids : 0;
	if (want > STATS_UIDS_MAX)
		want = STATS_UIDS_MAX;
	HASH_ITER(hh, d->reg.uids, u, utmp) {
		uint64_t bytes = u->host_bytes + u->gpu_bytes;
		size_t i;

		if (!want || (n == want && bytes <= uid_bytes(top[n - 1])))
			continue;
		if (n < want)
			n++;
		/* Insertion into the top list, biggest first. */
		for (i = n - 1; i > 0 && uid_bytes(top[i - 1]) < bytes; i--)
			top[i] = top[i - 1];
		top[i] = u;
	}
	for (size_t i = 0; i < n; i++) {
		dlshare__uid_stats__init(&rows[i]);
		rows[i].uid = (uint32_t)top[i]->uid;
		rows[i].names = top[i]->names;
		rows[i].versions = top[i]->versions;
		rows[i].bytes = uid_bytes(top[i]);
		rows[i].leases = top[i]->leases;
		rows[i].has_connections = 1;
		rows[i].connections = top[i]->owners;
		rowp[i] = &rows[i];
	}
	r.n_uids = n;
	r.uids = rowp;
	/* 1.5: the counters, for who asks (a monitor), not for every
	 * `dlsharectl stats`. */
	if (m->has_counters && m->counters) {
		s = &counters;
		stats_counters(d, m, &r, s);
	}
	f.body_case = DLSHARE__FRAME__BODY_STATS_REPLY;
	f.stats_reply = &r;
	f.id = id;
	/* A small --max-packet: fewer usage rows, then fewer uid rows, then
	 * fewer error rows, rather than a reply too large (which would cut
	 * the peer off). */
	while (dlshare__frame__get_packed_size(&f) > d->limits->max_packet &&
	       (r.n_usage || r.n_uids || r.n_errors)) {
		if (r.n_usage)
			r.n_usage /= 2;
		else if (r.n_uids)
			r.n_uids /= 2;
		else
			r.n_errors /= 2;
	}
	reply_send(peer, id, &f);
}
