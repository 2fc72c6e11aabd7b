/* encode — the registry's model in the wire's terms: a version's tensors
 * and buffers, and a name's summary, as the protobuf-c structs of a reply.
 * What it fills points into the model and lives for one reply, sent before
 * the model can change. Loop thread only.
 */
#ifndef DLSHARE_ENCODE_H
#define DLSHARE_ENCODE_H

#include "registry.h"

/* Versions of at most this many tensors are described without a malloc
 * (the common get of a tensor or a small bundle). */
#define ENCODE_VERSION_SMALL 4

/* The wire form of a version's tensors and buffers; lives for one reply. */
struct encode_version {
	Dlshare__Tensor *t;
	Dlshare__Tensor **tp;
	Dlshare__DataType *dt;
	Dlshare__Buffer *b;
	Dlshare__Buffer **bp;
	Dlshare__Device *dev;
	void *block;              /* t .. dev when they did not fit below */
	int fds[REGISTRY_BUFFERS_HARD_MAX + 1]; /* the buffers', then the
						 * manifest's */
	unsigned nfds;
	/* A version with a manifest memfd (1.4): it, always attached, and no
	 * tensors (has_manifest). */
	int has_manifest;
	Dlshare__Buffer manifest;
	Dlshare__Device manifest_dev;
	struct {
		Dlshare__Tensor t[ENCODE_VERSION_SMALL];
		Dlshare__Tensor *tp[ENCODE_VERSION_SMALL];
		Dlshare__DataType dt[ENCODE_VERSION_SMALL];
		Dlshare__Buffer b[ENCODE_VERSION_SMALL];
		Dlshare__Buffer *bp[ENCODE_VERSION_SMALL];
		Dlshare__Device dev[ENCODE_VERSION_SMALL];
	} small;
};

/* How a version's manifest memfd goes in a reply. */
enum encode_manifest {
	ENCODE_MANIFEST_FD,       /* 1.4: its fd, every time, id 0 */
	ENCODE_MANIFEST_KEPT_FD,  /* 1.5, a peer that keeps it: id and fd */
	ENCODE_MANIFEST_KEPT,     /* ...which it has already: the id alone */
};

/* Fills w from v (its tensors, or for a version with a manifest memfd
 * w->manifest, as mmode says, its fd last in w->fds). Buffers get
 * fd_attached (and their fd in w->fds: a reader's fd, see
 * registry_reader_fd) when attach says so for them (NULL: never). Returns
 * 0 or -ENOMEM; w needs encode_version_deinit after 0. */
int encode_version_init(struct encode_version *w, const struct version *v,
			const int *attach, enum encode_manifest mmode);
void encode_version_deinit(struct encode_version *w);

/* Fills ni with what a List or Stat says about e: its newest version's
 * number, tensors, bytes, kind; its owner, mode, versions and leases. */
void encode_name_info(Dlshare__NameInfo *ni, const struct entry *e);
/* Adds e's lifetime (1.4: owned, its owner's pid, TTL and time left) to ni,
 * filled by encode_name_info. */
void encode_name_lifetime(Dlshare__NameInfo *ni, const struct registry *r,
			  const struct entry *e);

#endif
