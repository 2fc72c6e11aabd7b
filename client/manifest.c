/* manifest — the client's side of manifest memfds (protocol 1.4): a
 * producer writes one when its tensors do not fit in a packet; a reader
 * maps the daemon's sealed one read-only and checks it before trusting an
 * offset of it. The format is proto/manifest.h's. Any thread. */
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "manifest.h"

int client_manifest_out(dlshare_client *c, Dlshare__Tensor *const *t,
			size_t n, int *fd, uint64_t *size)
{
	uint64_t packed = 0;
	void *map;
	int err, mfd;

	*fd = -1;
	*size = 0;
	/* Each tensor's packed size plus its tag and length prefix. */
	for (size_t i = 0; i < n && packed <= c->send_max / 2; i++)
		packed += dlshare__tensor__get_packed_size(t[i]) + 4;
	if (packed <= c->send_max / 2 || !c->manifests)
		return 0;
	err = manifest_size(t, n, size);
	if (err == -E2BIG) {
		errmsg_set("too many tensors, dims or key bytes for one "
			   "manifest (at most 4000000 tensors)");
		return DLSHARE_ELIMIT;
	}
	if (err)
		return DLSHARE_EINVAL;
	mfd = memfd_create("dlshare-manifest", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (mfd < 0)
		return client_errno(-errno);
	/* The daemon takes a memfd sealed against resizing, and adds the
	 * write seal itself once no mapping of ours is left. */
	if (ftruncate(mfd, (off_t)*size) ||
	    fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW)) {
		err = client_errno(-errno);
		close(mfd);
		return err;
	}
	map = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (map == MAP_FAILED) {
		err = client_errno(-errno);
		close(mfd);
		return err;
	}
	manifest_write(map, *size, t, n);
	munmap(map, *size);
	*fd = mfd;
	return 0;
}
