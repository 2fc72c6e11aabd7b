/* metrics — `dlsharectl metrics`: the daemon's counters in the Prometheus
 * text exposition format (libdlshare's dlshare_metrics), on stdout or, with
 * --output, in a file replaced atomically, as node_exporter's textfile
 * collector wants: it must never read half a file. */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Writes len bytes of text to path through a temporary file in the same
 * directory (so that rename is atomic), synced before the rename, and the
 * directory after it. The file is 0644: the collector runs as another
 * user. Returns 0 or -errno (the temporary file is gone then). */
static int write_atomic(const char *path, const char *text, size_t len)
{
	char tmp[PATH_MAX], dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	int fd, dfd, err = 0;

	int prefix = slash ? (int)(slash - path) + 1 : 0;

	if (strlen(path) >= sizeof(dir))
		return -ENAMETOOLONG;
	snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : prefix ?
		 prefix - 1 : 0, path);
	if (!*dir)
		strcpy(dir, ".");
	/* ".dlshare.prom.XXXXXX": the collector reads only *.prom files. */
	if ((size_t)snprintf(tmp, sizeof(tmp), "%.*s.%s.XXXXXX", prefix, path,
			     path + prefix) >= sizeof(tmp))
		return -ENAMETOOLONG;
	fd = mkostemp(tmp, O_CLOEXEC);
	if (fd < 0)
		return -errno;
	err = ctl_write_all(fd, text, len);
	if (!err && (fchmod(fd, 0644) || fsync(fd)))
		err = -errno;
	if (close(fd) && !err)
		err = -errno;
	if (!err && rename(tmp, path))
		err = -errno;
	if (err) {
		unlink(tmp);
		return err;
	}
	/* The rename itself survives a crash once the directory is synced. */
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		fsync(dfd);
		close(dfd);
	}
	return 0;
}

int cmd_metrics(const struct ctl *ctl)
{
	dlshare_client *c = NULL;
	char *text = NULL;
	size_t len = 0;
	int err, ret;

	ret = ctl_connect(ctl, &c);
	if (ret < 0 && !ctl->output)
		return ret;
	/* No daemon: the file still says so (dlshare_up 0), so that an
	 * alert fires rather than the last good file going stale. */
	err = dlshare_metrics(ret < 0 ? NULL : c, &text, &len);
	if (c)
		dlshare_disconnect(c);
	if (err < 0) {
		ctl_report("metrics", err, NULL);
		return CTL_EFAIL;
	}
	if (ctl->output) {
		int werr = write_atomic(ctl->output, text, len);

		if (werr)
			ctl_errmsg("metrics", "cannot write %s: %s",
				   ctl->output, strerror(-werr));
		free(text);
		return werr || ret < 0 ? CTL_EFAIL : CTL_OK;
	}
	err = ctl_write_all(STDOUT_FILENO, text, len);
	free(text);
	if (err) {
		ctl_errmsg("metrics", "cannot write to standard output: %s",
			   strerror(-err));
		return CTL_EFAIL;
	}
	return CTL_OK;
}
