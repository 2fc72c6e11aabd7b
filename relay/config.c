/* config — the option table, and the command line and INI file it reads. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include <dlshare/dlshare.h>

enum opt_type {
	OPT_STR,     /* a string, 1..4095 bytes */
	OPT_MODE,    /* octal permission bits, <= 0777 */
	OPT_U32,     /* integer in [lo, hi] */
	OPT_BYTES,   /* 64-bit integer in [lo, hi], K/M/G suffixes */
	OPT_CONNECT, /* appends a peer */
	OPT_MIRROR,  /* appends a prefix to the last peer */
};

struct opt {
	const char *name;     /* long flag and configuration key */
	char short_name;      /* 0: none */
	enum opt_type type;
	const char *arg;
	uint64_t lo, hi;
	size_t off;
	const char *help;
};

#define CFG(f) offsetof(struct relay_config, f)

static const struct opt opts[] = {
	{ "socket", 's', OPT_STR, "PATH", 1, 107, CFG(socket_path),
	  "this node's dlshared socket (default: as dlshared finds it)" },
	{ "listen", 'l', OPT_STR, "ADDR:PORT", 1, 300, CFG(listen),
	  "serve this node's names to relays that connect here" },
	{ "connect", 'c', OPT_CONNECT, "ADDR:PORT", 1, 300, 0,
	  "follow names on the relay at ADDR:PORT (repeatable)" },
	{ "mirror", 'm', OPT_MIRROR, "PREFIX", 1, 255, 0,
	  "mirror every name under PREFIX from the last --connect (repeatable)" },
	{ "key-file", 'k', OPT_STR, "FILE", 1, 4095, CFG(key_file),
	  "the pre-shared key (>= 16 bytes; not readable by group or other)" },
	{ "mode", 0, OPT_MODE, "MODE", 0, 0777, CFG(mode),
	  "permission bits of mirrored names (default 0644; 0: the daemon's)" },
	{ "node-name", 0, OPT_STR, "NAME", 1, 64, CFG(node_name),
	  "this node's name for peers (default: the host name)" },
	{ "chunk-size", 0, OPT_BYTES, "BYTES", 4096, (uint64_t)1 << 30, CFG(chunk_size),
	  "bytes per one-sided get (default 4M)" },
	{ "inline-max", 0, OPT_BYTES, "BYTES", 0, 1u << 20, CFG(inline_max),
	  "versions up to this many bytes travel in the offer (default 64K; 0: never)" },
	{ "max-inflight", 0, OPT_U32, "N", 1, 4096, CFG(max_inflight),
	  "gets outstanding at once, all pulls together (default 16)" },
	{ "device", 0, OPT_STR, "cpu|cuda:N", 1, 16, CFG(device_str),
	  "where mirrored device versions are created (default cpu: as host "
	  "versions)" },
	{ "gpu-path", 0, OPT_STR, "auto|direct|stage", 1, 16, CFG(gpu_path_str),
	  "device versions: straight between GPUs where both relays' UCX is "
	  "CUDA-aware, else staged (auto, the default); direct: fail to start "
	  "without a CUDA-aware UCX; stage: always staged" },
	{ "stage-slots", 0, OPT_U32, "N", 2, 32, CFG(stage_slots),
	  "pinned host chunks (of --chunk-size) staging one device version "
	  "being served (default 4)" },
	{ "max-peers", 0, OPT_U32, "N", 1, 4096, CFG(max_peers),
	  "connections accepted on --listen (default 64)" },
	{ "max-subscriptions", 0, OPT_U32, "N", 1, 1024, CFG(max_subscriptions),
	  "prefixes one connected peer may follow (default 16)" },
	{ "max-message", 0, OPT_BYTES, "BYTES", 4096, (uint64_t)1 << 32, CFG(max_message),
	  "bytes of one relay message, e.g. an offer's manifest (default 64M)" },
	{ "scan-interval-ms", 0, OPT_U32, "MS", 10, 600000, CFG(scan_interval_ms),
	  "with a 1.5 daemon: how often a served prefix is listed for new "
	  "names (default 250)" },
	{ "auth-timeout-ms", 0, OPT_U32, "MS", 100, 600000, CFG(auth_timeout_ms),
	  "a peer must authenticate within this (default 5000)" },
	{ "transfer-timeout-ms", 0, OPT_U32, "MS", 100, 86400000, CFG(transfer_timeout_ms),
	  "a peer that holds an offer longer is cut off (default 60000)" },
	{ "reconnect-max-ms", 0, OPT_U32, "MS", 10, 3600000, CFG(reconnect_max_ms),
	  "longest wait between reconnects, doubling from 50 ms (default 5000)" },
	{ "auth-log-per-min", 0, OPT_U32, "N", 1, 100000, CFG(auth_log_per_min),
	  "failed authentications logged a minute; more are counted (default 10)" },
	{ "metrics-file", 0, OPT_STR, "PATH", 1, 4095, CFG(metrics_file),
	  "write the relay's metrics (Prometheus text) to PATH, replaced "
	  "atomically (default: none)" },
	{ "metrics-interval-s", 0, OPT_U32, "S", 1, 3600, CFG(metrics_interval_s),
	  "how often --metrics-file is written (default 15)" },
};
#define NOPTS (sizeof(opts) / sizeof(opts[0]))

void config_init(struct relay_config *c)
{
	memset(c, 0, sizeof(*c));
	c->mode = 0644;
	c->chunk_size = 4u << 20;
	c->max_inflight = 16;
	c->stage_slots = 4;
	c->device = -1;
	c->inline_max = 64u << 10;
	c->max_peers = 64;
	c->max_subscriptions = 16;
	c->max_message = 64u << 20;
	c->scan_interval_ms = 250;
	c->auth_timeout_ms = 5000;
	c->transfer_timeout_ms = 60000;
	c->reconnect_max_ms = 5000;
	c->auth_log_per_min = 10;
	c->metrics_interval_s = 15;
}

void config_deinit(struct relay_config *c)
{
	size_t i;
	int p, k;

	for (i = 0; i < NOPTS; i++)
		if (opts[i].type == OPT_STR)
			free(*(char **)((char *)c + opts[i].off));
	for (p = 0; p < c->npeers; p++) {
		free(c->peers[p].addr);
		for (k = 0; k < c->peers[p].nprefix; k++)
			free(c->peers[p].prefix[k]);
	}
	memset(c, 0, sizeof(*c));
}

int config_split_addr(const char *s, char *host, size_t hostlen,
		      uint16_t *port)
{
	const char *colon, *h = s;
	size_t hl;
	char *end;
	unsigned long v;

	colon = strrchr(s, ':');
	if (!colon || colon == s)
		return -1;
	hl = (size_t)(colon - s);
	if (s[0] == '[') {
		if (hl < 3 || s[hl - 1] != ']')
			return -1;
		h = s + 1;
		hl -= 2;
	}
	if (hl + 1 > hostlen)
		return -1;
	errno = 0;
	v = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || v == 0 || v > 65535)
		return -1;
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (uint16_t)v;
	return 0;
}

static int parse_u64(const char *s, int suffixes, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	if (!*s || *s == '-')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -1;
	if (suffixes && *end) {
		switch (*end) {
		case 'K': case 'k': mul = 1024; break;
		case 'M': case 'm': mul = 1024 * 1024; break;
		case 'G': case 'g': mul = 1024 * 1024 * 1024; break;
		default: return -1;
		}
		end++;
		if (!strcmp(end, "iB") || !strcmp(end, "B"))
			end += strlen(end);
	}
	if (*end || (mul > 1 && v > UINT64_MAX / mul))
		return -1;
	*out = v * mul;
	return 0;
}

/* Sets option o from text v; src names where it came from. */
static int set(struct relay_config *c, const struct opt *o, const char *v,
	       const char *src, FILE *err)
{
	void *field = (char *)c + o->off;
	uint64_t n;
	char *end;
	struct relay_peer_cfg *p;
	char host[300];
	uint16_t port;
	size_t len = strlen(v);

	switch (o->type) {
	case OPT_STR:
		if (len < o->lo || len > o->hi)
			goto range;
		free(*(char **)field);
		*(char **)field = strdup(v);
		return *(char **)field ? 0 : -1;
	case OPT_MODE:
		errno = 0;
		n = strtoul(v, &end, 8);
		if (errno || !*v || *end || n > o->hi)
			goto bad;
		*(uint32_t *)field = (uint32_t)n;
		return 0;
	case OPT_U32:
	case OPT_BYTES:
		if (parse_u64(v, o->type == OPT_BYTES, &n))
			goto bad;
		if (n < o->lo || n > o->hi)
			goto range;
		if (o->type == OPT_U32)
			*(uint32_t *)field = (uint32_t)n;
		else
			*(uint64_t *)field = n;
		return 0;
	case OPT_CONNECT:
		if (config_split_addr(v, host, sizeof(host), &port))
			goto bad;
		if (c->npeers == RELAY_MAX_CONNECT) {
			fprintf(err, "dlshare-relay: %s: more than %d --connect\n",
				src, RELAY_MAX_CONNECT);
			return -1;
		}
		p = &c->peers[c->npeers];
		p->addr = strdup(v);
		if (!p->addr)
			return -1;
		c->npeers++;
		return 0;
	case OPT_MIRROR:
		if (!c->npeers) {
			fprintf(err, "dlshare-relay: %s: --mirror %s comes before "
				"any --connect (each --mirror follows the peer of "
				"the --connect before it)\n", src, v);
			return -1;
		}
		if (len < 1 || len > o->hi || strspn(v,
		    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._/-") != len)
			goto bad;
		p = &c->peers[c->npeers - 1];
		if (p->nprefix == RELAY_MAX_MIRROR) {
			fprintf(err, "dlshare-relay: %s: more than %d --mirror for "
				"--connect %s\n", src, RELAY_MAX_MIRROR, p->addr);
			return -1;
		}
		p->prefix[p->nprefix] = strdup(v);
		if (!p->prefix[p->nprefix])
			return -1;
		p->nprefix++;
		return 0;
	}
bad:
	fprintf(err, "dlshare-relay: %s: --%s: invalid value '%s'\n", src,
		o->name, v);
	return -1;
range:
	fprintf(err, "dlshare-relay: %s: --%s: '%s' is outside %llu..%llu%s\n",
		src, o->name, v, (unsigned long long)o->lo,
		(unsigned long long)o->hi,
		o->type == OPT_STR ? " bytes" : "");
	return -1;
}

static const struct opt *find(const char *name)
{
	size_t i;

	for (i = 0; i < NOPTS; i++)
		if (!strcmp(opts[i].name, name))
			return &opts[i];
	return NULL;
}

struct ini_ctx {
	struct relay_config *c;
	const char *path;
	FILE *err;
	int failed;
};

static int ini_cb(void *arg, const char *section, const char *key,
		  const char *value)
{
	struct ini_ctx *x = arg;
	const struct opt *o = find(key);
	char src[4200];

	if (x->failed)
		return 0;
	if (section[0] && strcmp(section, "relay")) {
		fprintf(x->err, "dlshare-relay: %s: unknown section [%s] "
			"(only [relay])\n", x->path, section);
		x->failed = 1;
		return 0;
	}
	if (!o) {
		fprintf(x->err, "dlshare-relay: %s: unknown key '%s'\n", x->path,
			key);
		x->failed = 1;
		return 0;
	}
	snprintf(src, sizeof(src), "%s", x->path);
	if (set(x->c, o, value, src, x->err))
		x->failed = 1;
	return 1;
}

static void usage(FILE *out)
{
	size_t i;
	char flag[64];

	fputs("Usage: dlshare-relay [OPTION]...\n"
	      "Mirrors dlshare names between nodes over UCX.\n\n"
	      "  dlshare-relay --socket PATH --listen ADDR:PORT --key-file FILE\n"
	      "  dlshare-relay --socket PATH --connect ADDR:PORT --mirror PREFIX "
	      "--key-file FILE\n\n", out);
	for (i = 0; i < NOPTS; i++) {
		if (opts[i].short_name)
			snprintf(flag, sizeof(flag), "-%c, --%s %s",
				 opts[i].short_name, opts[i].name, opts[i].arg);
		else
			snprintf(flag, sizeof(flag), "    --%s %s", opts[i].name,
				 opts[i].arg);
		fprintf(out, "  %-34s %s\n", flag, opts[i].help);
	}
	fputs("      --config FILE                  read these settings "
	      "from an INI file\n"
	      "                                     (keys as the long options, "
	      "optional [relay])\n"
	      "  -h, --help                         this help\n"
	      "  -V, --version                      the version\n\n"
	      "Sizes take K, M, G suffixes (powers of 1024). The command line "
	      "overrides\nthe file, except --connect/--mirror, which add to it. "
	      "UCX does not\nencrypt: use the relay on a trusted cluster network. "
	      "UCX itself reads\nUCX_* variables (UCX_TLS, UCX_NET_DEVICES).\n",
	      out);
}

int config_parse(struct relay_config *c, int argc, char **argv, FILE *out,
		 FILE *err)
{
	struct option lo[NOPTS + 4];
	char shorts[64] = "+hV";
	const char *config_file = NULL;
	size_t i, n = 0;
	int ch, pass;

	for (i = 0; i < NOPTS; i++) {
		lo[n++] = (struct option){ opts[i].name, required_argument, NULL,
					   256 + (int)i };
		if (opts[i].short_name) {
			size_t l = strlen(shorts);
			shorts[l] = opts[i].short_name;
			shorts[l + 1] = ':';
			shorts[l + 2] = 0;
		}
	}
	lo[n++] = (struct option){ "config", required_argument, NULL, 1000 };
	lo[n++] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[n++] = (struct option){ "version", no_argument, NULL, 'V' };
	lo[n] = (struct option){ NULL, 0, NULL, 0 };

	/* Pass 0 finds --config and reads it; pass 1 applies the command
	 * line over it. */
	for (pass = 0; pass < 2; pass++) {
		optind = 1;
		opterr = pass == 1;
		while ((ch = getopt_long(argc, argv, shorts, lo, NULL)) != -1) {
			const struct opt *o = NULL;

			if (ch == 'h' || ch == 'V') {
				if (pass == 0)
					continue;
				if (ch == 'h')
					usage(out);
				else
					fprintf(out, "dlshare-relay %s\n",
						dlshare_version());
				return 1;
			}
			if (ch == 1000) {
				config_file = optarg;
				continue;
			}
			if (ch == '?' || ch == ':') {
				if (pass == 1) {
					fputs("Run 'dlshare-relay --help' for the "
					      "options.\n", err);
					return -1;
				}
				continue;
			}
			if (pass == 0)
				continue;
			if (ch >= 256)
				o = &opts[ch - 256];
			else
				for (i = 0; i < NOPTS; i++)
					if (opts[i].short_name == ch)
						o = &opts[i];
			if (!o || set(c, o, optarg, "command line", err))
				return -1;
		}
		if (pass == 0 && config_file) {
			struct ini_ctx x = { c, config_file, err, 0 };
			int r = ini_parse(config_file, ini_cb, &x);

			if (r < 0) {
				fprintf(err, "dlshare-relay: %s: cannot read: %s\n",
					config_file, strerror(errno));
				return -1;
			}
			if (r > 0) {
				fprintf(err, "dlshare-relay: %s:%d: syntax error\n",
					config_file, r);
				return -1;
			}
			if (x.failed)
				return -1;
		}
	}
	if (optind < argc) {
		fprintf(err, "dlshare-relay: unexpected argument '%s'\n",
			argv[optind]);
		return -1;
	}
	if (c->device_str && strcmp(c->device_str, "cpu")) {
		unsigned long d;
		char *end;

		errno = 0;
		if (strncmp(c->device_str, "cuda:", 5) ||
		    !isdigit((unsigned char)c->device_str[5]) ||
		    (d = strtoul(c->device_str + 5, &end, 10), errno) || *end ||
		    d > 1023) {
			fprintf(err, "dlshare-relay: --device '%s': not cpu or "
				"cuda:N\n", c->device_str);
			return -1;
		}
		c->device = (int)d;
	}
	if (!c->gpu_path_str || !strcmp(c->gpu_path_str, "auto")) {
		c->gpu_path = GPU_PATH_AUTO;
	} else if (!strcmp(c->gpu_path_str, "direct")) {
		c->gpu_path = GPU_PATH_DIRECT;
	} else if (!strcmp(c->gpu_path_str, "stage")) {
		c->gpu_path = GPU_PATH_STAGE;
	} else {
		fprintf(err, "dlshare-relay: --gpu-path '%s': not auto, direct "
			"or stage\n", c->gpu_path_str);
		return -1;
	}
	if (!c->key_file) {
		fputs("dlshare-relay: --key-file is required\n", err);
		return -1;
	}
	if (!c->listen && !c->npeers) {
		fputs("dlshare-relay: nothing to do: give --listen, or --connect "
		      "with --mirror\n", err);
		return -1;
	}
	for (i = 0; i < (size_t)c->npeers; i++)
		if (!c->peers[i].nprefix) {
			fprintf(err, "dlshare-relay: --connect %s has no --mirror\n",
				c->peers[i].addr);
			return -1;
		}
	return 0;
}
