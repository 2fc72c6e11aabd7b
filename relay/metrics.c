/* metrics — the relay's own counters in the Prometheus text exposition
 * format (0.0.4), written every --metrics-interval-s to --metrics-file
 * through a temporary file in the same directory and a rename, as
 * node_exporter's textfile collector wants (it must never read half a
 * file; `dlsharectl metrics --output` does the same for the daemon). The
 * file is a few dozen lines: the loop writes it on its tick, between
 * progress calls, and at the end (final values). Loop thread. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

/* Label values of dlshare_relay_transfers_failed_total{side="mirror"}:
 * why a pull was aborted. */
static const char *const mirror_reasons[RF_MIRROR_N] = {
	[RF_PEER_LOST] = "peer-lost",       /* the serving relay went away */
	[RF_ORIGIN_ABORT] = "origin-abort", /* its staging failed (ABORT) */
	[RF_DAEMON] = "daemon",             /* this node's create or seal */
	[RF_TRANSFER] = "transfer",         /* a UCX get or rkey */
	[RF_CUDA] = "cuda",                 /* staging into a GPU here */
	[RF_OTHER] = "other",
};

/* ... {side="serve"}: why an offer of this node's was not pulled. */
static const char *const serve_reasons[RS_N] = {
	[RS_PEER_LOST] = "peer-lost",     /* the mirror went away */
	[RS_PEER_FAILED] = "peer-failed", /* it answered DONE 2 */
	[RS_TIMEOUT] = "timeout",         /* --transfer-timeout-ms */
	[RS_STAGING] = "staging",         /* a CUDA error staging it here */
	[RS_NOT_OFFERED] = "not-offered", /* it could not be offered */
};

enum relay_fail metrics_reason_of(const char *why)
{
	/* p->why as mirror.c and stage.c write it */
	static const struct {
		const char *prefix;
		enum relay_fail r;
	} map[] = {
		{ "the peer went away", RF_PEER_LOST },
		{ "the origin ", RF_ORIGIN_ABORT },
		{ "create:", RF_DAEMON },
		{ "seal:", RF_DAEMON },
		{ "the writer has", RF_DAEMON },
		{ "get:", RF_TRANSFER },
		{ "rkey:", RF_TRANSFER },
		{ "register:", RF_TRANSFER },
		{ "host-to-device copy:", RF_CUDA },
		{ "staging on GPU", RF_CUDA },
		{ "the peer's staging ring", RF_CUDA },
		{ "no CUDA runtime", RF_CUDA },
		{ "the CUDA runtime", RF_CUDA },
	};
	size_t i;

	for (i = 0; i < sizeof(map) / sizeof(map[0]); i++)
		if (!strncmp(why, map[i].prefix, strlen(map[i].prefix)))
			return map[i].r;
	return RF_OTHER;
}

struct out {
	char *p;
	size_t len, cap;
	int oom;
};

static void put(struct out *o, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void put(struct out *o, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (o->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(o->p ? o->p + o->len : NULL,
			      o->p ? o->cap - o->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			o->oom = 1;
			return;
		}
		if (o->p && o->len + (size_t)n < o->cap) {
			o->len += (size_t)n;
			return;
		}
		{
			size_t cap = (o->cap ? o->cap : 2048);
			char *np;

			while (cap <= o->len + (size_t)n)
				cap *= 2;
			np = realloc(o->p, cap);
			if (!np) {
				o->oom = 1;
				return;
			}
			o->p = np;
			o->cap = cap;
		}
	}
}

static void family(struct out *o, const char *name, const char *type,
		   const char *help)
{
	put(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Staging slots holding bytes now: sent to a peer and not given back
 * (serving), or announced by the peer and not yet given back (mirroring). */
static void slots_in_use(struct relay *r, uint64_t *serve, uint64_t *mirror)
{
	struct conn *c;

	*serve = *mirror = 0;
	for (c = r->conns; c; c = c->next) {
		struct sub *s;
		struct pull *p;
		uint32_t i;

		for (s = c->subs; s; s = s->next)
			*serve += (uint64_t)__builtin_popcount(s->stg_out);
		for (p = c->pulls; p; p = p->next)
			for (i = 0; p->staged && p->chunks && i < p->nslots; i++)
				if (p->chunks[i].st != PC_EMPTY)
					(*mirror)++;
	}
}

static int render(struct relay *r, struct out *o)
{
	struct relay_metrics *m = &r->m;
	uint64_t serving = 0, mirroring = 0, sslots, mslots;
	struct conn *c;
	int i;

	for (c = r->conns; c; c = c->next)
		if (c->state == C_READY) {
			if (c->serving)
				serving++;
			else
				mirroring++;
		}
	slots_in_use(r, &sslots, &mslots);

	family(o, "dlshare_relay_versions_mirrored_total", "counter",
	       "Versions pulled from peers and sealed in this node's daemon.");
	put(o, "dlshare_relay_versions_mirrored_total %" PRIu64 "\n",
	    m->mirrored);
	family(o, "dlshare_relay_versions_skipped_total", "counter",
	       "Offers not pulled: this node had that origin version already.");
	put(o, "dlshare_relay_versions_skipped_total %" PRIu64 "\n",
	    m->skipped);
	family(o, "dlshare_relay_pulled_bytes_total", "counter",
	       "Tensor bytes of the versions mirrored.");
	put(o, "dlshare_relay_pulled_bytes_total %" PRIu64 "\n",
	    m->pulled_bytes);
	family(o, "dlshare_relay_versions_served_total", "counter",
	       "Versions of this node that peers pulled and sealed.");
	put(o, "dlshare_relay_versions_served_total %" PRIu64 "\n", m->served);
	family(o, "dlshare_relay_served_bytes_total", "counter",
	       "Tensor bytes of the versions served.");
	put(o, "dlshare_relay_served_bytes_total %" PRIu64 "\n",
	    m->served_bytes);
	family(o, "dlshare_relay_transfers_failed_total", "counter",
	       "Transfers that published nothing, by side and reason.");
	for (i = 0; i < RF_MIRROR_N; i++)
		put(o, "dlshare_relay_transfers_failed_total{side=\"mirror\","
		    "reason=\"%s\"} %" PRIu64 "\n", mirror_reasons[i],
		    m->mirror_failed[i]);
	for (i = 0; i < RS_N; i++)
		put(o, "dlshare_relay_transfers_failed_total{side=\"serve\","
		    "reason=\"%s\"} %" PRIu64 "\n", serve_reasons[i],
		    m->serve_failed[i] + (i == RS_NOT_OFFERED ?
			__atomic_load_n(&m->not_offered_threads,
					__ATOMIC_RELAXED) : 0));
	family(o, "dlshare_relay_peers", "gauge",
	       "Authenticated peer connections, by role of this relay.");
	put(o, "dlshare_relay_peers{role=\"serving\"} %" PRIu64 "\n", serving);
	put(o, "dlshare_relay_peers{role=\"mirroring\"} %" PRIu64 "\n",
	    mirroring);
	family(o, "dlshare_relay_auth_failures_total", "counter",
	       "Failed authentications, either way (logged or not).");
	put(o, "dlshare_relay_auth_failures_total %" PRIu64 "\n",
	    m->auth_failures);
	family(o, "dlshare_relay_device_versions_total", "counter",
	       "Device versions moved, by side and by path: direct (device "
	       "memory registered with UCX) or stage (pinned host chunks).");
	for (i = 0; i < 4; i++)
		put(o, "dlshare_relay_device_versions_total{side=\"%s\","
		    "path=\"%s\"} %" PRIu64 "\n", i / 2 ? "mirror" : "serve",
		    i % 2 ? "direct" : "stage", m->device_versions[i / 2][i % 2]);
	family(o, "dlshare_relay_gpu_direct_capable", "gauge",
	       "1 when this relay says it gets and serves device memory "
	       "directly (a CUDA-aware UCX, --gpu-path not stage), else 0.");
	put(o, "dlshare_relay_gpu_direct_capable %d\n", r->gpu_direct ? 1 : 0);
	family(o, "dlshare_relay_staging_slots_in_use", "gauge",
	       "Pinned staging slots holding a device version's bytes.");
	put(o, "dlshare_relay_staging_slots_in_use{side=\"serve\"} %" PRIu64
	    "\n", sslots);
	put(o, "dlshare_relay_staging_slots_in_use{side=\"mirror\"} %" PRIu64
	    "\n", mslots);
	return o->oom ? -ENOMEM : 0;
}

/* Writes text to path through a temporary file in its directory and a
 * rename; 0644, the collector runs as another user. Not synced: a crash
 * may lose the last write, the next one replaces it. Returns 0 or
 * -errno. */
static int write_atomic(const char *path, const char *text, size_t len)
{
	char tmp[PATH_MAX];
	const char *slash = strrchr(path, '/');
	int prefix = slash ? (int)(slash - path) + 1 : 0, fd, err = 0;
	size_t off = 0;

	/* ".relay.prom.XXXXXX": the collector reads only *.prom files */
	if ((size_t)snprintf(tmp, sizeof(tmp), "%.*s.%s.XXXXXX", prefix, path,
			     path + prefix) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	while (off < len && !err) {
		ssize_t n = write(fd, text + off, len - off);

		if (n < 0 && errno != EINTR)
			err = -errno;
		else if (n > 0)
			off += (size_t)n;
	}
	if (!err && fchmod(fd, 0644))
		err = -errno;
	if (close(fd) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err)
		unlink(tmp);
	return err;
}

void metrics_tick(struct relay *r, bool now)
{
	struct out o = { 0 };
	uint64_t t = relay_now_ms();
	int err;

	if (!r->cfg->metrics_file || (!now && t < r->m.next_ms))
		return;
	r->m.next_ms = t + (uint64_t)r->cfg->metrics_interval_s * 1000;
	err = render(r, &o);
	if (!err)
		err = write_atomic(r->cfg->metrics_file, o.p, o.len);
	free(o.p);
	if (err && !r->m.warned)
		log_warn("cannot write --metrics-file %s: %s (said once)",
			 r->cfg->metrics_file, strerror(-err));
	r->m.warned = r->m.warned || err;
}
