/* metrics — the daemon's counter tables and the names of their rows. */
#include "metrics.h"

#include <string.h>

#include "dlshare.pb-c.h"

const uint8_t metrics_req_of_body[64] = {
	[DLSHARE__FRAME__BODY_HELLO] = METRICS_REQ_HELLO,
	[DLSHARE__FRAME__BODY_CREATE] = METRICS_REQ_CREATE,
	[DLSHARE__FRAME__BODY_SEAL] = METRICS_REQ_SEAL,
	[DLSHARE__FRAME__BODY_ABORT] = METRICS_REQ_ABORT,
	[DLSHARE__FRAME__BODY_PUBLISH] = METRICS_REQ_PUBLISH,
	[DLSHARE__FRAME__BODY_GET] = METRICS_REQ_GET,
	[DLSHARE__FRAME__BODY_TAKE] = METRICS_REQ_TAKE,
	[DLSHARE__FRAME__BODY_RELEASE] = METRICS_REQ_RELEASE,
	[DLSHARE__FRAME__BODY_DELETE] = METRICS_REQ_DELETE,
	[DLSHARE__FRAME__BODY_LIST] = METRICS_REQ_LIST,
	[DLSHARE__FRAME__BODY_STAT] = METRICS_REQ_STAT,
	[DLSHARE__FRAME__BODY_STATS] = METRICS_REQ_STATS,
	[DLSHARE__FRAME__BODY_GOODBYE] = METRICS_REQ_GOODBYE,
	[DLSHARE__FRAME__BODY_WATCH] = METRICS_REQ_WATCH,
	[DLSHARE__FRAME__BODY_UNTAKE] = METRICS_REQ_UNTAKE,
	[DLSHARE__FRAME__BODY_CHANNEL] = METRICS_REQ_CHANNEL,
};

static const char *const req_names[METRICS_REQ_N] = {
	[METRICS_REQ_OTHER] = "other",
	[METRICS_REQ_HELLO] = "hello",
	[METRICS_REQ_CREATE] = "create",
	[METRICS_REQ_SEAL] = "seal",
	[METRICS_REQ_ABORT] = "abort",
	[METRICS_REQ_PUBLISH] = "publish",
	[METRICS_REQ_GET] = "get",
	[METRICS_REQ_TAKE] = "take",
	[METRICS_REQ_RELEASE] = "release",
	[METRICS_REQ_DELETE] = "delete",
	[METRICS_REQ_LIST] = "list",
	[METRICS_REQ_STAT] = "stat",
	[METRICS_REQ_STATS] = "stats",
	[METRICS_REQ_GOODBYE] = "goodbye",
	[METRICS_REQ_WATCH] = "watch",
	[METRICS_REQ_UNTAKE] = "untake",
	[METRICS_REQ_CHANNEL] = "channel",
};

/* By -code: include/dlshare/dlshare.h's DLSHARE_E* without the prefix. */
static const char *const code_names[METRICS_CODES] = {
	"other", "EINVAL", "ENOENT", "ETIMEDOUT", "EPERM", "ENOMEM", "ELIMIT",
	"EPROTO", "ECONN", "EVERSION", "ENOTSUP", "EIO", "EBUSY", "ECOPY",
	"ENODEV", "ESTATE", "E2BIG", "ECLOSED", "EFORK",
};

static const char *const limit_names[METRICS_LIMIT_N] = {
	[METRICS_LIMIT_OTHER] = "other",
	[METRICS_LIMIT_MAX_CONNECTIONS] = "max-connections",
	[METRICS_LIMIT_UID_CONNECTIONS] = "uid-connections",
	[METRICS_LIMIT_MAX_INFLIGHT] = "max-inflight",
	[METRICS_LIMIT_MAX_TENSORS] = "max-tensors",
	[METRICS_LIMIT_MAX_BUFFER_BYTES] = "max-buffer-bytes",
	[METRICS_LIMIT_MAX_PACKET] = "max-packet",
	[METRICS_LIMIT_MAX_BYTES] = "max-bytes",
	[METRICS_LIMIT_MAX_OPEN_FDS] = "max-open-fds",
	[METRICS_LIMIT_MAX_PENDING] = "max-pending",
	[METRICS_LIMIT_MAX_LEASES] = "max-leases",
	[METRICS_LIMIT_MAX_OUT_FDS] = "max-out-fds",
	[METRICS_LIMIT_MAX_TTL] = "max-ttl",
	[METRICS_LIMIT_MAX_QUEUE_DEPTH] = "max-queue-depth",
	[METRICS_LIMIT_QUEUE_FULL] = "queue-full",
	[METRICS_LIMIT_UID_NAMES] = "uid-names",
	[METRICS_LIMIT_UID_LEASES] = "uid-leases",
	[METRICS_LIMIT_UID_PENDING] = "uid-pending",
	[METRICS_LIMIT_UID_FDS] = "uid-fds",
	[METRICS_LIMIT_UID_OPEN_FDS] = "uid-open-fds",
	[METRICS_LIMIT_UID_HOST_BYTES] = "uid-host-bytes",
	[METRICS_LIMIT_UID_GPU_BYTES] = "uid-gpu-bytes",
	[METRICS_LIMIT_UID_LEASED_BYTES] = "uid-leased-bytes",
	[METRICS_LIMIT_UID_LEASED_GPU_BYTES] = "uid-leased-gpu-bytes",
	[METRICS_LIMIT_UID_MANIFEST_BYTES] = "uid-manifest-bytes",
	[METRICS_LIMIT_BOARD_SLOTS] = "board-slots",
};

static const char *const cut_names[METRICS_CUT_N] = {
	[METRICS_CUT_OTHER] = "other",
	[METRICS_CUT_SLOW_READER] = "slow-reader",
	[METRICS_CUT_OVERSIZE] = "oversize",
	[METRICS_CUT_BAD_FRAME] = "bad-frame",
	[METRICS_CUT_PROTOCOL] = "protocol",
	[METRICS_CUT_VERSION] = "version",
	[METRICS_CUT_HELLO_TIMEOUT] = "hello-timeout",
	[METRICS_CUT_IO_ERROR] = "io-error",
	[METRICS_CUT_DAEMON_ERROR] = "daemon-error",
};

/* conn_fail's reasons (conn.c, dispatch.c, peer.c, server.c). */
static const struct {
	const char *why;
	int cut;
} cut_whys[] = {
	{ "peer hung up", -1 },
	{ "output limit reached", METRICS_CUT_SLOW_READER },
	{ "fd limit reached", METRICS_CUT_SLOW_READER },
	{ "packet larger than the limit", METRICS_CUT_OVERSIZE },
	{ "too many fds in one packet", METRICS_CUT_OVERSIZE },
	{ "channel request larger than its slot", METRICS_CUT_OVERSIZE },
	{ "channel request with id 0", METRICS_CUT_PROTOCOL },
	{ "malformed packet", METRICS_CUT_BAD_FRAME },
	{ "fd count does not match the packet", METRICS_CUT_BAD_FRAME },
	{ "no Hello in time", METRICS_CUT_HELLO_TIMEOUT },
	{ "no Hello", METRICS_CUT_PROTOCOL },
	{ "Hello sent twice", METRICS_CUT_PROTOCOL },
	{ "request with id 0", METRICS_CUT_PROTOCOL },
	{ "unexpected fds", METRICS_CUT_PROTOCOL },
	{ "unsupported protocol major", METRICS_CUT_VERSION },
	{ "send failed", METRICS_CUT_IO_ERROR },
	{ "receive failed", METRICS_CUT_IO_ERROR },
	{ "channel read failed", METRICS_CUT_IO_ERROR },
	{ "poll failed", METRICS_CUT_IO_ERROR },
	{ "out of memory", METRICS_CUT_DAEMON_ERROR },
	{ "cannot duplicate fd", METRICS_CUT_DAEMON_ERROR },
	{ "out of fds to receive", METRICS_CUT_DAEMON_ERROR },
	{ "reply too large", METRICS_CUT_DAEMON_ERROR },
};

int metrics_cut_of(const char *why)
{
	if (!why)
		return -1;
	for (size_t i = 0; i < sizeof(cut_whys) / sizeof(*cut_whys); i++)
		if (!strcmp(why, cut_whys[i].why) ||
		    (cut_whys[i].cut == METRICS_CUT_SLOW_READER &&
		     !strncmp(why, cut_whys[i].why, strlen(cut_whys[i].why))))
			return cut_whys[i].cut;
	return METRICS_CUT_OTHER;
}

const char *metrics_req_name(enum metrics_req r)
{
	return r < METRICS_REQ_N ? req_names[r] : "other";
}

const char *metrics_code_name(unsigned col)
{
	return col < METRICS_CODES ? code_names[col] : "other";
}

const char *metrics_limit_name(enum metrics_limit l)
{
	return l < METRICS_LIMIT_N ? limit_names[l] : "other";
}

const char *metrics_cut_name(enum metrics_cut c)
{
	return c < METRICS_CUT_N ? cut_names[c] : "other";
}
