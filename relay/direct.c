/* direct — device versions straight between device memories, for a
 * CUDA-aware UCX (sites with GPUDirect RDMA link one of their own; Debian's
 * 1.13 is not, and stage.c's pinned ring serves there): the serving relay
 * registers the lease's device buffers (ucp_mem_map, memory type CUDA) and
 * offers their rkeys in an OFFER_DEVICE; the mirror gets them in chunks
 * straight into its writer (a device version with --device cuda:N, whose
 * buffer it registers too, else a host one) and seals. Whether both relays
 * can is said once per connection, after WELCOME (CAPS); either one that
 * cannot makes every device version of the connection staged. Loop thread.
 *
 * DLSHARE_RELAY_DEVICE_MEMORY_IS_HOST=1 is the tests' hook: fakecuda's
 * device memory is host memory of the process, so the relay calls itself
 * capable and registers that memory as host memory, and the direct path's
 * protocol, chunking, sealing and faults run in CI without a GPU.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define TEST_HOOK "DLSHARE_RELAY_DEVICE_MEMORY_IS_HOST"

int direct_init(struct relay *r)
{
	ucp_context_attr_t a = { .field_mask = UCP_ATTR_FIELD_MEMORY_TYPES };
	const char *hook = getenv(TEST_HOOK);
	ucs_status_t st = ucp_context_query(r->ctx, &a);
	bool cuda = st == UCS_OK &&
		    (a.memory_types & UCS_BIT(UCS_MEMORY_TYPE_CUDA));

	r->dev_mem_type = UCS_MEMORY_TYPE_CUDA;
	if (hook && !strcmp(hook, "1")) {
		log_warn(TEST_HOOK "=1: device memory is registered with UCX "
			 "as host memory (a test hook for fakecuda, whose device "
			 "memory is host memory; never with a real GPU)");
		cuda = true;
		r->dev_mem_type = UCS_MEMORY_TYPE_HOST;
	}
	if (r->cfg->gpu_path == GPU_PATH_DIRECT && !cuda) {
		log_err("--gpu-path direct: this UCX (%s) cannot register CUDA "
			"memory (%s); use a UCX built with CUDA, or --gpu-path "
			"auto or stage", ucp_get_version_string(),
			st == UCS_OK ? "its context's memory types lack cuda" :
			ucs_status_string(st));
		return -1;
	}
	r->gpu_direct = cuda && r->cfg->gpu_path != GPU_PATH_STAGE;
	log_info("device versions: %s", r->gpu_direct ?
		 "direct where the peer's relay can get device memory too, "
		 "else staged" : cuda ? "staged (--gpu-path stage)" :
		 "staged (this UCX is not CUDA-aware)");
	return 0;
}

uint32_t direct_caps(const struct relay *r)
{
	return r->gpu_direct ? CAPS_DEVICE_GET : 0;
}

void direct_caps_send(struct relay *r, struct conn *c)
{
	struct wbuf w;

	c->caps_sent = direct_caps(r);
	wbuf_start(&w, MSG_CAPS);
	wbuf_u32(&w, c->caps_sent);
	conn_send(c, &w);
}

int direct_caps_recv(struct relay *r, struct conn *c, struct rbuf *rb)
{
	uint32_t flags = rbuf_u32(rb);

	if (rb->bad || rbuf_left(rb) || c->caps_got)
		return -1;
	c->caps_got = true;
	c->peer_caps = flags;
	if (!(c->caps_sent & CAPS_DEVICE_GET))
		return 0;
	if (flags & CAPS_DEVICE_GET)
		log_info("peer %s%s%s: device versions go direct", c->peer,
			 c->node[0] ? " node " : "", c->node);
	else
		relay_log(r->cfg->gpu_path == GPU_PATH_DIRECT ? 4 : 6,
			  "peer %s%s%s: its relay cannot get device memory (a "
			  "UCX that is not CUDA-aware, or --gpu-path stage): "
			  "device versions are staged", c->peer,
			  c->node[0] ? " node " : "", c->node);
	return 0;
}

ucs_status_t direct_map(struct relay *r, void *addr, uint64_t len,
			unsigned prot, ucs_memory_type_t type, ucp_mem_h *out)
{
	ucp_mem_map_params_t mp = { 0 };

	mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
			UCP_MEM_MAP_PARAM_FIELD_LENGTH |
			UCP_MEM_MAP_PARAM_FIELD_PROT |
			UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
	mp.address = addr;
	mp.length = len;
	mp.prot = prot;
	mp.memory_type = type;
	return ucp_mem_map(r->ctx, &mp, out);
}

int direct_pull_map(struct relay *r, struct pull *p)
{
	uint64_t lo = UINT64_MAX, hi = 0;
	ucs_status_t st;
	uint32_t i;

	if (!p->direct || r->cfg->device < 0)
		return 0;
	/* A store writer has one buffer: its tensors' span lies in it. */
	for (i = 0; i < p->ntensors; i++) {
		DLTensor *t = dlshare_writer_tensor(p->w, i);
		uint64_t a;

		if (!p->tlen[i])
			continue;
		a = (uint64_t)(uintptr_t)t->data + t->byte_offset;
		lo = a < lo ? a : lo;
		hi = a + p->tlen[i] > hi ? a + p->tlen[i] : hi;
	}
	if (hi <= lo)
		return 0;
	st = direct_map(r, (void *)(uintptr_t)lo, hi - lo,
			UCP_MEM_MAP_PROT_LOCAL_READ |
			UCP_MEM_MAP_PROT_LOCAL_WRITE, r->dev_mem_type, &p->wmemh);
	if (st != UCS_OK) {
		p->wmemh = NULL;
		snprintf(p->why, sizeof(p->why), "register: the writer's device "
			 "buffer on GPU %d: %s", r->cfg->device,
			 ucs_status_string(st));
		return -1;
	}
	return 0;
}

void direct_pull_unmap(struct relay *r, struct pull *p)
{
	if (p->wmemh)
		ucp_mem_unmap(r->ctx, p->wmemh);
	p->wmemh = NULL;
}
