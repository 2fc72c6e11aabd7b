/* config — the option table, and the command line and INI file it reads. */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include <ini.h>

#include <dlshare/dlshare.h>

#include "manifest.h"
#include "registry.h"

/* How an option's text becomes a value. */
enum opt_type {
	OPT_PATH,    /* the socket path: 1..107 bytes */
	OPT_MODE,    /* octal permission bits within hi; not 0 when lo is 1 */
	OPT_U32,     /* integer in [lo, hi] */
	OPT_U64,
	OPT_BYTES,   /* 64-bit integer in [lo, hi], K/M/G/T suffixes */
	OPT_BYTES32, /* the same, 32 bits wide */
	OPT_LEVEL,   /* log level */
	OPT_PREFIX,  /* log prefix */
};

struct opt {
	const char *name;     /* long flag and configuration key */
	char short_name;      /* 0: none */
	enum opt_type type;
	const char *arg;      /* the value's name in help */
	uint64_t lo, hi;
	size_t off;           /* of the value in struct config */
	const char *group;    /* heading, on the first option of a group */
	const char *help;     /* one line for --help */
	const char *doc;      /* more, for the man pages; may be NULL */
	const char *dflt;     /* the default in words when it is not a
			       * fixed value (NULL: printed from the code) */
};

#define CFG(f) offsetof(struct config, f)
#define SRV(f) offsetof(struct config, server.f)

/* The table. Defaults are not here: config_init() takes them from
 * server_config_default() and registry_limits_default(), and everything that
 * shows a default prints it from there. */
static const struct opt opts[] = {
	{ "socket", 's', OPT_PATH, "PATH", 1, sizeof(((struct sockaddr_un *)0)->sun_path) - 1,
	  SRV(socket_path), "Socket",
	  "listen on PATH",
	  "Under socket activation (systemd's dlshared.socket) the socket "
	  "systemd passes is used instead, and this is ignored with a warning "
	  "when it names another path.",
	  "$DLSHARE_SOCKET, else /run/dlshare/dlshared.sock if it exists, else "
	  "$XDG_RUNTIME_DIR/dlshare/dlshared.sock, else "
	  "/tmp/dlshare-$UID/dlshared.sock" },
	{ "socket-mode", 0, OPT_MODE, "OCTAL", 0, 0777,
	  SRV(socket_mode), NULL,
	  "permissions of the socket file",
	  "Only for a socket dlshared binds itself; under socket activation "
	  "SocketMode= in dlshared.socket decides.", NULL },
	{ "default-mode", 0, OPT_MODE, "OCTAL", 1, 0666,
	  SRV(registry.default_mode), NULL,
	  "mode of a name whose publisher gives none",
	  "Owner, group and other read (4) and write (2) bits; "
	  "not 0.", NULL },

	{ "log-level", 'l', OPT_LEVEL, "LEVEL", 0, 0,
	  CFG(log_level), "Logging",
	  "the most verbose priority logged", NULL, NULL },
	{ "log-prefix", 0, OPT_PREFIX, "WHEN", 0, 0,
	  CFG(log_prefix), NULL,
	  "when lines get sd-daemon priority prefixes",
	  "auto writes \"<N>\" priority prefixes when stderr is the journal "
	  "(JOURNAL_STREAM names it) and plain lines otherwise.", NULL },
	{ "log-rate-limit", 0, OPT_U32, "N", 0, 1000000,
	  CFG(log_rate), NULL,
	  "warning/info/debug lines a second; 0: no limit",
	  "Lines about peers beyond this many a second are dropped, and one "
	  "line says how many. Error and notice lines are never dropped.", NULL },

	{ "max-packet", 0, OPT_BYTES32, "BYTES", 4096, 200 * 1024,
	  SRV(limits.max_packet), "Limits (a peer past one gets an error, or is disconnected)",
	  "size of one packet",
	  "A larger incoming packet is a protocol error and disconnects the "
	  "peer. Above the kernel's default socket buffer a packet cannot be "
	  "sent at all, hence the maximum.", NULL },
	{ "max-fds", 0, OPT_U32, "N", 1, 64,
	  SRV(limits.max_fds), NULL,
	  "fds in one packet",
	  "More is a protocol error and disconnects the peer.", NULL },
	{ "max-inflight", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(limits.max_inflight), NULL,
	  "requests in flight per connection: waiting gets and takes, creates "
	  "waiting for room in a queue, seals, GPU creates",
	  "One more fails with DLSHARE_ELIMIT.", NULL },
	{ "max-connections", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(limits.max_connections), NULL,
	  "connections at once",
	  "A peer beyond it gets an error and is closed.", NULL },
	{ "max-output", 0, OPT_BYTES, "BYTES", 64 * 1024, UINT64_C(1) << 34,
	  SRV(limits.max_output), NULL,
	  "output queued to one peer",
	  "A peer that does not read its replies is disconnected past "
	  "it.", NULL },
	{ "list-page", 0, OPT_U32, "N", 1, 4096,
	  SRV(limits.list_page), NULL,
	  "names per list answer", NULL, NULL },
	{ "max-watch-names", 0, OPT_U32, "N", 1, 4096,
	  SRV(limits.max_watch_names), NULL,
	  "names per watch answer (protocol 1.6)",
	  "A watch that finds more changed names answers this many, oldest "
	  "change first, and says there is more.", NULL },
	{ "watch-deletions", 0, OPT_U32, "N", 1, 1u << 24,
	  SRV(limits.watch_deletions), NULL,
	  "deletions remembered for watches (protocol 1.6)",
	  "A watcher behind the oldest one kept is told it may have missed "
	  "some, and lists the names again.", NULL },
	{ "board-slots", 0, OPT_U32, "N", 0, BOARD_SLOTS_MAX,
	  SRV(limits.board_slots), NULL,
	  "names the version board follows (protocol 1.7); 0: no board",
	  "The board is a read-only memfd of one 64-bit word per slot that "
	  "every client maps. A name takes a slot at the first get of a "
	  "host-only newest version, and keeps it while it lives. A reader "
	  "that still holds such a version's lease then answers the next "
	  "get of the name itself while its word says that version is still "
	  "the newest, without a round trip. Past the limit, gets of further "
	  "names are answered by the daemon every time, as without a "
	  "board, each counted as a board-slots limit hit.", NULL },
	{ "channel", 0, OPT_U32, "0|1", 0, 1,
	  SRV(limits.channel), NULL,
	  "request channels (protocol 1.9); 0: every request over the socket",
	  "A client that asks gets a shared memfd of 16 KiB and an eventfd: "
	  "it sends a get or take that waits for nothing through them, and "
	  "the answer comes back there unless it attaches fds. Each costs "
	  "the daemon one fd (the eventfd) per connection, counted beside "
	  "max-connections where max-open-fds is worked out. Needs Linux "
	  "5.12 or later (off, with a warning, before).", NULL },
	{ "max-tensors", 0, OPT_U32, "N", 1, MANIFEST_TENSORS_HARD_MAX,
	  SRV(registry.max_tensors), NULL,
	  "tensors per version",
	  "A version larger than a packet describes its tensors in a sealed "
	  "manifest memfd (protocol 1.4). One past it fails with "
	  "DLSHARE_ELIMIT; the protocol never takes more than 4000000.",
	  NULL },
	{ "max-buffers", 0, OPT_U32, "N", 1, REGISTRY_BUFFERS_HARD_MAX,
	  SRV(registry.max_buffers), NULL,
	  "buffers per version (at most max-fds)", NULL, NULL },
	{ "max-leases", 0, OPT_U32, "N", 1, 1u << 30,
	  SRV(registry.max_leases), NULL,
	  "leases per connection",
	  "One more get fails with DLSHARE_ELIMIT.", NULL },
	{ "max-pending", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.max_pending), NULL,
	  "pending (created, not yet sealed) versions per connection",
	  "Each holds its buffers' memfds. One more create fails with "
	  "DLSHARE_ELIMIT.", NULL },
	{ "queue-depth", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.queue_depth), NULL,
	  "depth of a queue name whose creator asks for the default",
	  "Pending, queued, and taken but not released versions count "
	  "toward a queue name's depth. Clipped to max-queue-depth.", NULL },
	{ "max-queue-depth", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.max_queue_depth), NULL,
	  "the most a queue name's depth may be",
	  "A create or publish asking for a deeper queue fails with "
	  "DLSHARE_ELIMIT.", NULL },
	{ "max-bytes", 0, OPT_BYTES, "BYTES", 0, UINT64_MAX,
	  SRV(registry.max_bytes), NULL,
	  "bytes of all daemon-owned buffers",
	  "Store buffers only; exported memory is the producer's. A create "
	  "past it fails with DLSHARE_ELIMIT.",
	  "half of the machine's memory" },
	{ "max-buffer-bytes", 0, OPT_BYTES, "BYTES", 1, INT64_MAX,
	  SRV(registry.max_buffer_bytes), NULL,
	  "size of one buffer", NULL, NULL },
	{ "max-out-fds", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(limits.max_out_fds), NULL,
	  "fds queued to one peer that does not read",
	  "A get that would queue more fails with DLSHARE_ELIMIT.", NULL },
	{ "max-open-fds", 0, OPT_U32, "N", 0, 1u << 30,
	  SRV(registry.max_open_fds), NULL,
	  "fds held for all peers' buffers and queued replies; 0: derived",
	  "Every buffer holds its fds (a host buffer two: its memfd and the "
	  "read-only reopen readers get; a cuda-vmm buffer one) while a "
	  "version keeps it. dlshared raises its RLIMIT_NOFILE soft limit to "
	  "the hard one at start; 0 leaves out of that 128 fds of its own and "
	  "one per connection (max-connections), so that accepting and "
	  "serving a new peer always finds an fd. A create, publish or get "
	  "past it fails with DLSHARE_ELIMIT. The fds of a host buffer of "
	  "256 KiB or more that the daemon lets go are closed on its thread "
	  "pool (the close frees the pages, ~50 ms per GiB, which the loop "
	  "must not wait for) and count until they are.",
	  "0, RLIMIT_NOFILE less 128 and max-connections" },
	{ "hello-timeout", 0, OPT_U32, "MS", 100, 3600 * 1000,
	  SRV(limits.hello_timeout_ms), NULL,
	  "milliseconds a new peer has to say Hello",
	  "A peer that says nothing is disconnected after it.", NULL },

	{ "default-ttl", 0, OPT_U32, "MS", 0, 0xffffffffu,
	  SRV(registry.default_ttl_ms), "Name lifetimes",
	  "TTL of a new name whose publisher asks for none; 0: none",
	  "A name with a TTL is deleted when no version of it was sealed for "
	  "that long (a name never sealed: since its creation); versions "
	  "leased then live on until released. At most max-ttl.", NULL },
	{ "max-ttl", 0, OPT_U32, "MS", 1, 0xffffffffu,
	  SRV(registry.max_ttl_ms), NULL,
	  "longest TTL a create or publish may ask for",
	  "A longer one fails with DLSHARE_ELIMIT, naming max-ttl.", NULL },

	{ "uid-connections", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.uid_connections), "Quotas per uid (over all its connections)",
	  "connections of one uid",
	  "One more is refused with an error.", NULL },
	{ "uid-names", 0, OPT_U32, "N", 1, 1u << 30,
	  SRV(registry.uid_names), NULL,
	  "names one uid created",
	  "Publishing a new name past it fails with DLSHARE_ELIMIT.", NULL },
	{ "uid-leases", 0, OPT_U32, "N", 1, 1u << 30,
	  SRV(registry.uid_leases), NULL,
	  "leases of one uid",
	  "One more get fails with DLSHARE_ELIMIT.", NULL },
	{ "uid-fds", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.uid_fds), NULL,
	  "fds queued to one uid's connections",
	  "A get that would queue more fails with DLSHARE_ELIMIT.", NULL },
	{ "uid-host-bytes", 0, OPT_BYTES, "BYTES", 0, UINT64_MAX,
	  SRV(registry.uid_host_bytes), NULL,
	  "daemon-owned host bytes of one uid; 0: as max-bytes",
	  "Counted while a version is pending or its name's newest; an older "
	  "version kept only by leases is charged to its leaseholders "
	  "(uid-leased-bytes). A create past it fails with DLSHARE_ELIMIT.",
	  "0, the same as max-bytes" },
	{ "uid-leased-bytes", 0, OPT_BYTES, "BYTES", 0, UINT64_MAX,
	  SRV(registry.uid_leased_bytes), NULL,
	  "daemon-owned host bytes of the versions one uid holds leases on; "
	  "0: as uid-host-bytes",
	  "A version counts once per uid, however many leases the uid holds on "
	  "it. A get past it fails with DLSHARE_ELIMIT.",
	  "0, the same as uid-host-bytes" },
	{ "uid-pending", 0, OPT_U32, "N", 1, 1u << 20,
	  SRV(registry.uid_pending), NULL,
	  "pending versions of one uid",
	  "One more create fails with DLSHARE_ELIMIT.", NULL },
	{ "uid-open-fds", 0, OPT_U32, "N", 0, 1u << 30,
	  SRV(registry.uid_open_fds), NULL,
	  "fds held for one uid; 0: half of max-open-fds",
	  "The fds of its pending and newest versions, of the versions it "
	  "holds leases on, and those queued in replies to it: one uid can "
	  "never take every fd of the daemon. A create, publish or get past "
	  "it fails with DLSHARE_ELIMIT.",
	  "0, half of max-open-fds" },
	{ "uid-seals", 0, OPT_U32, "N", 1, 1024,
	  SRV(limits.uid_seals), NULL,
	  "seals of one uid running at once; also its manifest checks",
	  "Write-sealing a buffer runs on libuv's thread pool (UV_THREADPOOL_SIZE "
	  "threads, 4 by default, shared with GPU creates): the kernel makes it "
	  "wait while pages are pinned. A uid's further seals wait their "
	  "turn. So do its checks of manifest memfds (protocol 1.4), counted "
	  "apart from its seals.", NULL },
	{ "huge-page-min", 0, OPT_BYTES, "BYTES", 0, INT64_MAX,
	  SRV(registry.huge_min), NULL,
	  "store buffers from this size on use 2 MiB huge pages; 0: never",
	  "Only while the kernel's pool (vm.nr_hugepages) has free pages; "
	  "otherwise normal pages. Sealing a large version is then ~500 times "
	  "cheaper; sizes are rounded up to 2 MiB.",
	  "0, never" },
	{ "uid-gpu-bytes", 0, OPT_BYTES, "BYTES", 0, UINT64_MAX,
	  SRV(registry.uid_gpu_bytes), NULL,
	  "daemon-owned GPU bytes of one uid; 0: no cap but the devices' memory",
	  "Counted as uid-host-bytes is. A create of device memory past it "
	  "fails with DLSHARE_ELIMIT.",
	  "0, no cap" },
	{ "uid-leased-gpu-bytes", 0, OPT_BYTES, "BYTES", 0, UINT64_MAX,
	  SRV(registry.uid_leased_gpu_bytes), NULL,
	  "daemon-owned GPU bytes of the versions one uid holds leases on; "
	  "0: as uid-gpu-bytes",
	  "Counted as uid-leased-bytes is. A get past it fails with "
	  "DLSHARE_ELIMIT.",
	  "0, the same as uid-gpu-bytes" },
	{ "uid-manifest-bytes", 0, OPT_BYTES, "BYTES", 4096, UINT64_MAX,
	  SRV(registry.uid_manifest_bytes), NULL,
	  "metadata bytes (tensor descriptions) of the versions one uid "
	  "produced",
	  "A version's manifest memfd counts its size, an inline version the "
	  "memory its description takes in the daemon. A 10^6-tensor "
	  "manifest with 60-byte keys is about 110 MB. A publish or create "
	  "past it fails with DLSHARE_ELIMIT. The same limit applies, "
	  "apart, to the metadata bytes of the versions a uid holds leases "
	  "on (charged once per uid and version, as leased bytes are): a "
	  "get past it fails with DLSHARE_ELIMIT.", NULL },
};

#define NOPTS ((int)(sizeof(opts) / sizeof(opts[0])))
_Static_assert(NOPTS <= CONFIG_MAX_OPTIONS, "raise CONFIG_MAX_OPTIONS");

/* getopt values of the options outside the table. */
enum {
	ARG_TABLE = 1000,     /* + index into opts */
	ARG_CONFIG = 'c',
	ARG_HELP = 'h',
	ARG_VERSION = 'V',
	ARG_CHECK = 900,
	ARG_PRINT,
};

int config_option_count(void)
{
	return NOPTS;
}

const char *config_option_name(int i)
{
	return i >= 0 && i < NOPTS ? opts[i].name : NULL;
}

static void *field(struct config *c, const struct opt *o)
{
	return (char *)c + o->off;
}

static const void *cfield(const struct config *c, const struct opt *o)
{
	return (const char *)c + o->off;
}

void config_init(struct config *c)
{
	memset(c, 0, sizeof(*c));
	server_config_default(&c->server);
	c->log_level = LOG_INFO;
	c->log_prefix = LOG_PREFIX_AUTO;
	c->log_rate = CONFIG_LOG_RATE_DEFAULT;
}

void config_deinit(struct config *c)
{
	free(c->path);
	free(c->file);
	c->path = NULL;
	c->file = NULL;
	c->server.socket_path = NULL;
}

static const struct opt *find(const char *name)
{
	for (int i = 0; i < NOPTS; i++)
		if (strcmp(opts[i].name, name) == 0)
			return &opts[i];
	return NULL;
}

__attribute__((format(printf, 3, 4)))
static void report(FILE *err, const char *where, const char *fmt, ...)
{
	va_list ap;

	if (!err)
		return;
	fprintf(err, "%s: ", where);
	va_start(ap, fmt);
	vfprintf(err, fmt, ap);
	va_end(ap);
	fputc('\n', err);
}

/* Parses an unsigned integer: decimal, or hex after 0x; with units, a K, M,
 * G or T suffix (powers of 1024, optionally followed by "iB" or "B").
 * Returns 0, or -EINVAL (not a number) or -ERANGE (too big). */
static int parse_number(const char *s, int units, uint64_t *out)
{
	static const char suffixes[] = "KMGT";
	unsigned long long v;
	const char *p;
	char *end;
	int base = 10;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
		base = 16;
		s += 2;
	}
	/* strtoull takes signs and blanks; a number here has neither. */
	if (!(base == 10 ? *s >= '0' && *s <= '9' :
	      (*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f') ||
	      (*s >= 'A' && *s <= 'F')))
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, base);
	if (errno == ERANGE)
		return -ERANGE;
	if (units && base == 10 && *end &&
	    (p = strchr(suffixes, *end & ~0x20)) != NULL) {
		unsigned shift = 10 * (unsigned)(p - suffixes + 1);

		end++;
		if (strcmp(end, "iB") == 0 || strcmp(end, "B") == 0)
			end += strlen(end);
		if (v > (UINT64_MAX >> shift))
			return -ERANGE;
		v <<= shift;
	}
	if (*end)
		return -EINVAL;
	*out = v;
	return 0;
}

/* "4096", or "128K" when the value is a whole number of K, M, G or T. */
static void format_bytes(uint64_t v, char *buf, size_t len)
{
	static const char suffixes[] = "KMGT";
	int i = -1;

	while (v && i < 3 && (v & 1023) == 0) {
		v >>= 10;
		i++;
	}
	if (i < 0)
		snprintf(buf, len, "%llu", (unsigned long long)v);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)v,
			 suffixes[i]);
}

/* What a value must look like, for errors and the man page. */
static void describe(const struct opt *o, char *buf, size_t len)
{
	char lo[32], hi[32];

	switch (o->type) {
	case OPT_PATH:
		snprintf(buf, len, "a path of 1 to %llu bytes",
			 (unsigned long long)o->hi);
		break;
	case OPT_MODE:
		snprintf(buf, len, "octal permission bits within %04llo%s",
			 (unsigned long long)o->hi, o->lo ? ", not 0" : "");
		break;
	case OPT_U32:
	case OPT_U64:
		snprintf(buf, len, "an integer from %llu to %llu",
			 (unsigned long long)o->lo, (unsigned long long)o->hi);
		break;
	case OPT_BYTES:
	case OPT_BYTES32:
		format_bytes(o->lo, lo, sizeof(lo));
		format_bytes(o->hi, hi, sizeof(hi));
		snprintf(buf, len, "a size from %s to %s (suffixes K, M, G, "
			 "T: powers of 1024)", lo, hi);
		break;
	case OPT_LEVEL:
		snprintf(buf, len, "error, warning, notice, info or debug");
		break;
	case OPT_PREFIX:
		snprintf(buf, len, "auto, always or never");
		break;
	}
}

/* The current value of o in c as text that parses back. */
static void format_value(const struct config *c, const struct opt *o,
			 char *buf, size_t len)
{
	const void *p = cfield(c, o);

	switch (o->type) {
	case OPT_PATH:
		snprintf(buf, len, "%s", c->path ? c->path : "");
		break;
	case OPT_MODE:
		snprintf(buf, len, "%04o", *(const unsigned *)p);
		break;
	case OPT_U32:
		snprintf(buf, len, "%u", *(const uint32_t *)p);
		break;
	case OPT_U64:
		snprintf(buf, len, "%llu",
			 (unsigned long long)*(const uint64_t *)p);
		break;
	case OPT_BYTES:
		format_bytes(*(const uint64_t *)p, buf, len);
		break;
	case OPT_BYTES32:
		format_bytes(*(const uint32_t *)p, buf, len);
		break;
	case OPT_LEVEL:
		snprintf(buf, len, "%s", log_level_name(*(const int *)p));
		break;
	case OPT_PREFIX:
		snprintf(buf, len, "%s",
			 log_prefix_name(*(const enum log_prefix *)p));
		break;
	}
}

int config_set(struct config *c, const char *key, const char *value,
	       const char *where, int src, FILE *err)
{
	const struct opt *o = find(key);
	void *p;
	uint64_t v = 0;
	char want[128];
	int r;

	if (!o) {
		report(err, where, "unknown key '%s'", key);
		return -ENOENT;
	}
	p = field(c, o);
	switch (o->type) {
	case OPT_PATH:
		r = *value && strlen(value) <= o->hi ? 0 : -EINVAL;
		if (!r) {
			char *copy = strdup(value);

			if (!copy) {
				report(err, where, "out of memory");
				return -ENOMEM;
			}
			free(c->path);
			c->path = copy;
			c->server.socket_path = copy;
		}
		break;
	case OPT_MODE: {
		char *end;

		errno = 0;
		v = strtoull(value, &end, 8);
		r = (*value >= '0' && *value <= '7') && !errno && !*end &&
		    !(v & ~o->hi) && !(o->lo && v == 0) ? 0 : -EINVAL;
		if (!r)
			*(unsigned *)p = (unsigned)v;
		break;
	}
	case OPT_U32:
	case OPT_U64:
	case OPT_BYTES:
	case OPT_BYTES32:
		r = parse_number(value, o->type == OPT_BYTES ||
				 o->type == OPT_BYTES32, &v);
		if (!r && (v < o->lo || v > o->hi))
			r = -ERANGE;
		if (!r) {
			if (o->type == OPT_U32 || o->type == OPT_BYTES32)
				*(uint32_t *)p = (uint32_t)v;
			else
				*(uint64_t *)p = v;
		}
		break;
	case OPT_LEVEL:
		r = log_parse_level(value);
		if (r >= 0) {
			*(int *)p = r;
			r = 0;
		}
		break;
	case OPT_PREFIX:
		r = log_parse_prefix(value);
		if (r >= 0) {
			*(enum log_prefix *)p = (enum log_prefix)r;
			r = 0;
		}
		break;
	default:
		r = -EINVAL;
	}
	if (r) {
		describe(o, want, sizeof(want));
		report(err, where, "%s%s: invalid value '%s': expected %s",
		       src < 0 ? "--" : "", o->name, value, want);
		return -EINVAL;
	}
	c->src[o - opts] = src;
	return 0;
}

/* Where option i got its value, for errors about two options. */
static void source_of(const struct config *c, int i, char *buf, size_t len)
{
	if (c->src[i] > 0)
		snprintf(buf, len, "%s:%d", c->file ? c->file : "?", c->src[i]);
	else if (c->src[i] < 0)
		snprintf(buf, len, "--%s", opts[i].name);
	else
		snprintf(buf, len, "the default");
}

int config_validate(const struct config *c, FILE *err)
{
	const struct server_config *s = &c->server;
	int ib = (int)(find("max-buffers") - opts), ifd = (int)(find("max-fds") - opts);
	char a[160], b[160];

	if (s->registry.max_buffers > s->limits.max_fds) {
		source_of(c, ib, a, sizeof(a));
		source_of(c, ifd, b, sizeof(b));
		report(err, "dlshared", "max-buffers (%u, from %s) must not "
		       "exceed max-fds (%u, from %s): a version's buffers "
		       "travel in one packet", s->registry.max_buffers, a,
		       s->limits.max_fds, b);
		return -EINVAL;
	}
	if (s->registry.default_ttl_ms > s->registry.max_ttl_ms) {
		int it = (int)(find("default-ttl") - opts);
		int im = (int)(find("max-ttl") - opts);

		source_of(c, it, a, sizeof(a));
		source_of(c, im, b, sizeof(b));
		report(err, "dlshared", "default-ttl (%u ms, from %s) must not "
		       "exceed max-ttl (%u ms, from %s)",
		       s->registry.default_ttl_ms, a, s->registry.max_ttl_ms, b);
		return -EINVAL;
	}
	return 0;
}

/* ---- the file ------------------------------------------------------------ */

/* What the INI callbacks share: libinih gives the handler no line number
 * (unless built with INI_HANDLER_LINENO, which Debian's is not), so the
 * reader counts lines itself; libinih asks for exactly one line per call. */
struct ini_state {
	struct config *c;
	const char *path;
	FILE *f;
	FILE *err;
	int line;            /* of the line last read */
	int leading_blank;   /* it starts with white space */
	char last_key[64];   /* of the last key = value line */
	int last_line;
	char bad_section[64]; /* the unknown section last reported */
	int errors;
	int fatal;           /* -ENOMEM */
	char *buf;           /* getline's */
	size_t cap;
};

/* Whether a line (without its newline) is one libinih reads: blank, a
 * comment, a [section] or a key with '=' or ':'. */
static int ini_line_ok(const char *p)
{
	p += strspn(p, " \t\r");
	if (!*p || *p == '#' || *p == ';')
		return 1;
	if (*p == '[')
		return strchr(p, ']') != NULL;
	return p[strcspn(p, "=:")] != 0 && *p != '=' && *p != ':';
}

static char *ini_read(char *str, int num, void *stream)
{
	struct ini_state *st = stream;
	ssize_t n = getline(&st->buf, &st->cap, st->f);
	char where[300];

	if (n < 0)
		return NULL;
	st->line++;
	snprintf(where, sizeof(where), "%s:%d", st->path, st->line);
	st->leading_blank = n > 0 && (st->buf[0] == ' ' || st->buf[0] == '\t');
	if (n && st->buf[n - 1] == '\n')
		st->buf[--n] = 0;
	if (n + 2 > num) {
		/* libinih would cut it and read the rest as another line. */
		report(st->err, where, "line too long (at most %d bytes)",
		       num - 2);
		st->errors++;
		str[0] = 0;
		return str;
	}
	/* Find syntax errors here, where every one can be told in order;
	 * libinih would only give the first. An indented line continues
	 * the previous value; the handler says so. */
	if (!(st->leading_blank && st->last_key[0]) && !ini_line_ok(st->buf)) {
		report(st->err, where, "syntax error: expected 'key = value', "
		       "'[section]' or a comment");
		st->errors++;
		str[0] = 0;
		return str;
	}
	memcpy(str, st->buf, (size_t)n);
	str[n] = '\n';
	str[n + 1] = 0;
	return str;
}

static int ini_handle(void *user, const char *section, const char *name,
		      const char *value)
{
	struct ini_state *st = user;
	const struct opt *o;
	char where[300];
	int r;

	snprintf(where, sizeof(where), "%s:%d", st->path, st->line);
	if (st->leading_blank && strcmp(name, st->last_key) == 0 &&
	    st->last_line < st->line) {
		report(st->err, where, "an indented line continues '%s' from "
		       "line %d; remove the indentation", name, st->last_line);
		st->errors++;
		return 1;
	}
	snprintf(st->last_key, sizeof(st->last_key), "%s", name);
	st->last_line = st->line;
	if (*section && strcmp(section, "dlshared") != 0) {
		/* Once per section; its keys are not looked at. */
		if (strcmp(section, st->bad_section) != 0)
			report(st->err, where, "unknown section [%s]: keys go "
			       "at the top of the file or under [dlshared]",
			       section);
		snprintf(st->bad_section, sizeof(st->bad_section), "%s",
			 section);
		st->errors++;
		return 1;
	}
	o = find(name);
	if (o && st->c->src[o - opts] > 0) {
		report(st->err, where, "%s is already set on line %d", name,
		       st->c->src[o - opts]);
		st->errors++;
		return 1;
	}
	r = config_set(st->c, name, value, where, st->line, st->err);
	if (r == -ENOMEM)
		st->fatal = r;
	if (r)
		st->errors++;
	return 1;
}

int config_load_file(struct config *c, const char *path, FILE *err)
{
	struct ini_state st = { .c = c, .path = path, .err = err };
	char where[300];
	int r;

	st.f = fopen(path, "re");
	if (!st.f) {
		r = -errno;
		if (r != -ENOENT)
			report(err, path, "cannot read: %s", strerror(-r));
		return r;
	}
	free(c->file);
	c->file = strdup(path);
	if (!c->file) {
		fclose(st.f);
		report(err, path, "out of memory");
		return -ENOMEM;
	}
	r = ini_parse_stream(ini_read, &st, ini_handle, &st);
	if (r == 0 && ferror(st.f)) {
		report(err, path, "read error");
		st.errors++;
	}
	fclose(st.f);
	free(st.buf);
	if (st.fatal)
		return st.fatal;
	/* The handler never fails, so a line number back from libinih is a
	 * line it could not parse at all. */
	if (r > 0) {
		snprintf(where, sizeof(where), "%s:%d", path, r);
		report(err, where, "syntax error: expected 'key = value', "
		       "'[section]' or a comment");
		st.errors++;
	} else if (r < 0) {
		report(err, path, "cannot parse: out of memory");
		return -ENOMEM;
	}
	return st.errors ? -EINVAL : 0;
}

/* ---- the command line ------------------------------------------------------ */

static void print_default(FILE *out, const struct config *dflt,
			  const struct opt *o, const char *before,
			  const char *after)
{
	char v[160];

	if (o->dflt) {
		fprintf(out, "%s%s%s", before, o->dflt, after);
		return;
	}
	format_value(dflt, o, v, sizeof(v));
	fprintf(out, "%s%s%s", before, v, after);
}

/* Writes text word by word from column col, breaking lines before width;
 * a new line starts with lead. Returns the column reached. */
static int wrap(FILE *out, const char *text, int col, const char *lead,
		int width)
{
	while (*text) {
		int n = (int)strcspn(text, " ");

		if (col > (int)strlen(lead) && col + 1 + n > width) {
			fprintf(out, "\n%s", lead);
			col = (int)strlen(lead);
		} else if (col > (int)strlen(lead)) {
			fputc(' ', out);
			col++;
		}
		fwrite(text, 1, (size_t)n, out);
		col += n;
		text += n;
		while (*text == ' ')
			text++;
	}
	return col;
}

void config_usage(FILE *out)
{
	static const char lead[] = "                            ";
	struct config dflt;
	char text[512], v[160];

	config_init(&dflt);
	fprintf(out,
"Usage: dlshared [OPTION]...\n"
"Serve named tensors to processes on this machine over a Unix socket.\n"
"\n"
"  -c, --config PATH         read settings from PATH; without it, from\n"
"                            " DLSHARE_CONFIG_FILE " if it exists\n"
"      --check-config        check the settings, say if they are valid, exit\n"
"      --print-config        print the settings in effect as a file, exit\n");
	for (int i = 0; i < NOPTS; i++) {
		const struct opt *o = &opts[i];
		char left[64];
		int col;

		if (o->group)
			fprintf(out, "\n%s:\n", o->group);
		if (o->short_name)
			snprintf(left, sizeof(left), "  -%c, --%s %s",
				 o->short_name, o->name, o->arg);
		else
			snprintf(left, sizeof(left), "      --%s %s", o->name,
				 o->arg);
		col = (int)strlen(left);
		fputs(left, out);
		if (col >= (int)sizeof(lead) - 1) {
			fprintf(out, "\n%s", lead);
		} else {
			fprintf(out, "%*s", (int)sizeof(lead) - 1 - col, "");
		}
		col = (int)sizeof(lead) - 1;
		if (o->type == OPT_PATH)
			snprintf(v, sizeof(v), "see dlshared(8)");
		else if (o->dflt)
			snprintf(v, sizeof(v), "%s", o->dflt);
		else
			format_value(&dflt, o, v, sizeof(v));
		snprintf(text, sizeof(text), "%s (default: %s)", o->help, v);
		wrap(out, text, col, lead, 79);
		fputc('\n', out);
	}
	fprintf(out,
"\n"
"  -h, --help                show this help\n"
"  -V, --version             show the version\n"
"\n"
"Sizes take K, M, G, T suffixes (powers of 1024). Every option is also a key\n"
"of the configuration file (\"max-connections = 4096\"); see dlshared.conf(5).\n");
	config_deinit(&dflt);
}

void config_print(const struct config *c, FILE *out)
{
	char v[160];

	fprintf(out, "# dlshared %s: the settings in effect (from %s)\n"
		"[dlshared]\n", DLSHARE_VERSION_STRING,
		c->file ? c->file : "defaults and flags");
	for (int i = 0; i < NOPTS; i++) {
		if (opts[i].type == OPT_PATH && !c->path) {
			fprintf(out, "# %s = (the default rule)\n",
				opts[i].name);
			continue;
		}
		format_value(c, &opts[i], v, sizeof(v));
		fprintf(out, "%s = %s\n", opts[i].name, v);
	}
}

void config_print_example(FILE *out)
{
	struct config dflt;
	char want[128], text[512];

	config_init(&dflt);
	fprintf(out,
"# dlshared.conf — settings of dlshared(8); see dlshared.conf(5).\n"
"#\n"
"# dlshared reads /etc/dlshare/dlshared.conf when it exists (or the file\n"
"# --config names). Every key is also a command-line flag (--KEY VALUE),\n"
"# and flags win. Lines below show each key with its default; uncomment\n"
"# and change what you need, then run \"dlshared --check-config\".\n"
"\n"
"[dlshared]\n");
	for (int i = 0; i < NOPTS; i++) {
		const struct opt *o = &opts[i];

		if (o->group)
			fprintf(out, "\n# ---- %s\n", o->group);
		describe(o, want, sizeof(want));
		snprintf(text, sizeof(text), "%c%s. Value: %s.",
			 o->help[0] - ('a' <= o->help[0] && o->help[0] <= 'z' ?
				       'a' - 'A' : 0), o->help + 1, want);
		fputs("\n# ", out);
		wrap(out, text, 2, "# ", 78);
		fputc('\n', out);
		if (o->dflt) {
			snprintf(text, sizeof(text), "Default: %s.", o->dflt);
			fputs("# ", out);
			wrap(out, text, 2, "# ", 78);
			fprintf(out, "\n#%s =\n", o->name);
		} else {
			fprintf(out, "#%s = ", o->name);
			print_default(out, &dflt, o, "", "\n");
		}
	}
	config_deinit(&dflt);
}

/* Writes s for roff: backslashes doubled, '-' as \-, a leading '.' or '\''
 * escaped. */
static void roff(FILE *out, const char *s)
{
	if (*s == '.' || *s == '\'')
		fputs("\\&", out);
	for (; *s; s++) {
		if (*s == '\\')
			fputs("\\e", out);
		else if (*s == '-')
			fputs("\\-", out);
		else
			fputc(*s, out);
	}
}

void config_print_man(FILE *out, int keys)
{
	struct config dflt;
	char want[128], v[160];

	config_init(&dflt);
	for (int i = 0; i < NOPTS; i++) {
		const struct opt *o = &opts[i];

		if (o->group) {
			fputs(".SS \"", out);
			roff(out, o->group);
			fputs("\"\n", out);
		}
		fputs(".TP\n", out);
		if (keys) {
			fputs("\\fB", out);
			roff(out, o->name);
			fputs("\\fR = \\fI", out);
		} else {
			if (o->short_name)
				fprintf(out, "\\fB\\-%c\\fR, ", o->short_name);
			fputs("\\fB\\-\\-", out);
			roff(out, o->name);
			fputs("\\fR \\fI", out);
		}
		roff(out, o->arg);
		fputs("\\fR\n", out);
		/* The help line starts lower case; here it is a sentence. */
		if (o->help[0] >= 'a' && o->help[0] <= 'z')
			fputc(o->help[0] - 'a' + 'A', out);
		roff(out, o->help + 1);
		fputs(".\n", out);
		if (o->doc) {
			roff(out, o->doc);
			fputc('\n', out);
		}
		describe(o, want, sizeof(want));
		fputs("Value: ", out);
		roff(out, want);
		fputs(".\nDefault: ", out);
		if (o->dflt) {
			roff(out, o->dflt);
		} else {
			format_value(&dflt, o, v, sizeof(v));
			fputs("\\fB", out);
			roff(out, v);
			fputs("\\fR", out);
		}
		fputs(".\n", out);
	}
	config_deinit(&dflt);
}

static int build_longopts(struct option *lo)
{
	static const struct option fixed[] = {
		{ "config", required_argument, NULL, ARG_CONFIG },
		{ "check-config", no_argument, NULL, ARG_CHECK },
		{ "print-config", no_argument, NULL, ARG_PRINT },
		{ "help", no_argument, NULL, ARG_HELP },
		{ "version", no_argument, NULL, ARG_VERSION },
	};
	int n = 0;

	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		lo[n++] = fixed[i];
	for (int i = 0; i < NOPTS; i++)
		lo[n++] = (struct option){ opts[i].name, required_argument,
					   NULL, ARG_TABLE + i };
	lo[n] = (struct option){ NULL, 0, NULL, 0 };
	return n;
}

int config_from_args(struct config *c, int argc, char **argv, FILE *out,
		     FILE *err, enum config_action *action)
{
	struct option lo[CONFIG_MAX_OPTIONS + 8];
	/* ':' first: a missing value is ':', not '?'. */
	char shorts[2 * CONFIG_MAX_OPTIONS + 8] = ":c:hV";
	/* Flags are applied after the file, so they are kept until then. */
	struct { int opt; const char *arg; } set[256];
	const char *file = NULL;
	int nset = 0, help = 0, version = 0, r;

	/* Known before anything can fail, so that main() exits 1 for any
	 * error under --check-config. */
	*action = CONFIG_RUN;
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strcmp(argv[i], "--check-config") == 0)
			*action = CONFIG_CHECK;
	build_longopts(lo);
	for (int i = 0; i < NOPTS; i++)
		if (opts[i].short_name) {
			size_t n = strlen(shorts);

			shorts[n] = opts[i].short_name;
			shorts[n + 1] = ':';
			shorts[n + 2] = 0;
		}
	/* 0 restarts getopt fully (glibc), so tests may call this again. */
	optind = 0;
	opterr = 0;
	for (;;) {
		int ch = getopt_long(argc, argv, shorts, lo, NULL);

		if (ch == -1)
			break;
		switch (ch) {
		case ARG_CONFIG:
			file = optarg;
			break;
		case ARG_CHECK:
			*action = CONFIG_CHECK;
			break;
		case ARG_PRINT:
			*action = CONFIG_PRINT;
			break;
		case ARG_HELP:
			help = 1;
			break;
		case ARG_VERSION:
			version = 1;
			break;
		case ':':
			report(err, "dlshared", "%s needs a value",
			       argv[optind - 1]);
			goto usage;
		case '?':
			if (optopt)
				report(err, "dlshared", "unknown option '-%c'",
				       optopt);
			else
				report(err, "dlshared", "unknown option '%s'",
				       argv[optind - 1]);
			goto usage;
		default:
			/* A short option stands for its table entry. */
			for (int i = 0; i < NOPTS && ch < ARG_TABLE; i++)
				if (opts[i].short_name == ch)
					ch = ARG_TABLE + i;
			if (nset == (int)(sizeof(set) / sizeof(set[0]))) {
				report(err, "dlshared", "too many options");
				return -EINVAL;
			}
			set[nset].opt = ch - ARG_TABLE;
			set[nset].arg = optarg;
			nset++;
		}
	}
	if (optind < argc) {
		report(err, "dlshared", "unexpected argument '%s'",
		       argv[optind]);
		goto usage;
	}
	if (help) {
		config_usage(out);
		*action = CONFIG_EXIT;
		return 0;
	}
	if (version) {
		fprintf(out, "dlshared %s\n", DLSHARE_VERSION_STRING);
		*action = CONFIG_EXIT;
		return 0;
	}

	r = config_load_file(c, file ? file : DLSHARE_CONFIG_FILE, err);
	if (r == -ENOENT && file) {
		report(err, file, "cannot read: %s", strerror(ENOENT));
		return -EINVAL;
	}
	if (r == -ENOMEM)
		return r;
	if (r && r != -ENOENT)
		return -EINVAL;

	for (int i = 0; i < nset; i++) {
		r = config_set(c, opts[set[i].opt].name, set[i].arg,
			       "dlshared", -1, err);
		if (r == -ENOMEM)
			return r;
		if (r)
			return -EINVAL;
	}
	return config_validate(c, err);

usage:
	if (err)
		fputs("Run 'dlshared --help' for the options.\n", err);
	return -EINVAL;
}
