/* test_dev_events — protocol 1.4, events per device (issue 13): a version
 * whose tensors span two GPUs carries one event per device
 * (Publish.device_events), which the daemon checks, keeps and hands to 1.4
 * readers in GetReply.device_events; a 1.3 reader, which knows one event
 * only, is refused with DLSHARE_EVERSION instead of being handed a version
 * it would wait for half-way. Raw frames: the daemon needs no GPU for an
 * export of cuda-ipc handles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#define NDEV 2
#define BYTES 64

static int setup(void **state)
{
	return util_setup_fdcheck(state, NULL);
}

static int teardown(void **state)
{
	return util_teardown(state);
}

static int hello_minor(const struct daemon_proc *d, unsigned minor)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Hello h = DLSHARE__HELLO__INIT;
	struct wire_msg *m = NULL;
	int sock = raw_connect(d->sock);

	CHILD_CHECK(sock >= 0);
	h.major = WIRE_PROTO_MAJOR;
	h.minor = minor;
	h.agent = "test_dev_events";
	f.body_case = DLSHARE__FRAME__BODY_HELLO;
	f.hello = &h;
	f.id = 1;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	CHILD_CHECK(m->frame->body_case == DLSHARE__FRAME__BODY_HELLO_REPLY);
	CHILD_CHECK(m->frame->hello_reply->minor >= 4);
	wire_msg_free(m);
	return sock;
}

/* The answer's error code, 0 for the reply wanted, 1 for anything else. */
static int answer(struct wire_msg *m, Dlshare__Frame__BodyCase want)
{
	if (m->frame->body_case == DLSHARE__FRAME__BODY_ERROR)
		return m->frame->error->code;
	return m->frame->body_case == want ? 0 : 1;
}

enum bad { GOOD, BAD_UUID, BAD_BOTH, BAD_TWICE, BAD_SHORT };

/* Publishes name: two uint8[BYTES] tensors, each in a cuda-ipc buffer of
 * its own device, with an event per device (spoilt as bad says). Returns
 * the answer as answer() does. */
static int publish_span(int sock, uint64_t id, const char *name, enum bad bad)
{
	static uint8_t uuid[NDEV][16], mem[NDEV][64], ev[NDEV][64], other[16];
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Publish p = DLSHARE__PUBLISH__INIT;
	Dlshare__Tensor t[NDEV], *tp[NDEV];
	Dlshare__DataType dt = DLSHARE__DATA_TYPE__INIT;
	Dlshare__Buffer b[NDEV], *bp[NDEV];
	Dlshare__Device dev[NDEV];
	Dlshare__DeviceEvent de[NDEV], *dep[NDEV];
	static const char *const keys[NDEV] = { "a", "b" };
	int64_t shape[1] = { BYTES };
	struct wire_msg *m = NULL;
	int ret;

	dt.code = kDLUInt;
	dt.bits = 8;
	dt.lanes = 1;
	memset(other, 0xee, sizeof(other));
	for (int i = 0; i < NDEV; i++) {
		memset(uuid[i], 0x10 + i, sizeof(uuid[i]));
		memset(mem[i], 0x20 + i, sizeof(mem[i]));
		memset(ev[i], 0x30 + i, sizeof(ev[i]));
		dlshare__device__init(&dev[i]);
		dev[i].type = kDLCUDA;
		dev[i].has_uuid = 1;
		dev[i].uuid.data = uuid[i];
		dev[i].uuid.len = 16;
		dlshare__buffer__init(&b[i]);
		b[i].kind = DLSHARE__BUFFER_KIND__BUFFER_KIND_CUDA_IPC;
		b[i].size = BYTES;
		b[i].device = &dev[i];
		b[i].has_ipc_handle = 1;
		b[i].ipc_handle.data = mem[i];
		b[i].ipc_handle.len = 64;
		b[i].has_ipc_offset = 1;
		bp[i] = &b[i];
		dlshare__tensor__init(&t[i]);
		t[i].key = (char *)keys[i];
		t[i].dtype = &dt;
		t[i].n_shape = 1;
		t[i].shape = shape;
		t[i].buffer = (uint32_t)i;
		tp[i] = &t[i];
		dlshare__device_event__init(&de[i]);
		de[i].uuid.data = uuid[i];
		de[i].uuid.len = 16;
		de[i].handle.data = ev[i];
		de[i].handle.len = 64;
		dep[i] = &de[i];
	}
	switch (bad) {
	case BAD_UUID:
		de[1].uuid.data = other;
		break;
	case BAD_BOTH:
		p.has_event_handle = 1;
		p.event_handle.data = ev[0];
		p.event_handle.len = 64;
		break;
	case BAD_TWICE:
		de[1].uuid.data = uuid[0];
		break;
	case BAD_SHORT:
		de[1].handle.len = 8;
		break;
	case GOOD:
		break;
	}
	p.name = (char *)name;
	p.n_tensors = NDEV;
	p.tensors = tp;
	p.n_buffers = NDEV;
	p.buffers = bp;
	p.n_device_events = NDEV;
	p.device_events = dep;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_PUBLISH;
	f.publish = &p;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, &m) == 0);
	ret = answer(m, DLSHARE__FRAME__BODY_PUBLISH_REPLY);
	wire_msg_free(m);
	return ret;
}

/* Gets name; *out is the answer (the caller frees it). */
static int get(int sock, uint64_t id, const char *name, struct wire_msg **out)
{
	Dlshare__Frame f = DLSHARE__FRAME__INIT;
	Dlshare__Get g = DLSHARE__GET__INIT;

	g.name = (char *)name;
	f.id = id;
	f.body_case = DLSHARE__FRAME__BODY_GET;
	f.get = &g;
	CHILD_CHECK(raw_call(sock, &f, NULL, 0, out) == 0);
	return answer(*out, DLSHARE__FRAME__BODY_GET_REPLY);
}

static int span_child(const struct daemon_proc *d, void *arg)
{
	int prod = hello_minor(d, 4), new = hello_minor(d, 4);
	int old = hello_minor(d, 3);
	struct wire_msg *m = NULL;
	Dlshare__GetReply *r;

	(void)arg;
	/* Refused: an event on a device none of its buffers is on; both
	 * kinds of event; one device twice; a short handle. */
	CHILD_CHECK(publish_span(prod, 10, "dev/bad", BAD_UUID) ==
		    DLSHARE_EINVAL);
	CHILD_CHECK(publish_span(prod, 11, "dev/bad", BAD_BOTH) ==
		    DLSHARE_EINVAL);
	CHILD_CHECK(publish_span(prod, 12, "dev/bad", BAD_TWICE) ==
		    DLSHARE_EINVAL);
	CHILD_CHECK(publish_span(prod, 13, "dev/bad", BAD_SHORT) ==
		    DLSHARE_EINVAL);
	CHILD_CHECK(publish_span(prod, 14, "dev/span", GOOD) == 0);

	/* A 1.4 reader gets each device's event, by UUID. */
	CHILD_CHECK(get(new, 20, "dev/span", &m) == 0);
	r = m->frame->get_reply;
	CHILD_CHECK(!r->has_event_handle);
	CHILD_CHECK(r->n_device_events == NDEV);
	for (size_t i = 0; i < NDEV; i++) {
		uint8_t want[64];

		memset(want, 0x30 + (int)i, sizeof(want));
		CHILD_CHECK(r->device_events[i]->uuid.len == 16 &&
			    r->device_events[i]->uuid.data[0] == 0x10 + i);
		CHILD_CHECK(r->device_events[i]->handle.len == 64 &&
			    memcmp(r->device_events[i]->handle.data, want,
				   64) == 0);
	}
	wire_msg_free(m);

	/* A 1.3 reader is told why, and its connection stays usable. */
	CHILD_CHECK(get(old, 30, "dev/span", &m) == DLSHARE_EVERSION);
	CHILD_CHECK(m->frame->error->message &&
		    strstr(m->frame->error->message, "dev/span") &&
		    strstr(m->frame->error->message, "1.4"));
	wire_msg_free(m);
	CHILD_CHECK(get(old, 31, "dev/none", &m) == DLSHARE_ENOENT);
	wire_msg_free(m);
	close(old);
	close(new);
	close(prod);
	return 0;
}

static void version_with_an_event_per_device(void **state)
{
	struct fixture *fx = *state;

	assert_int_equal(util_wait(util_spawn(&fx->d, span_child, NULL)), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(version_with_an_event_per_device,
						setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
