/* fds — the open fds of a process, counted from /proc/PID/fd: every test
 * checks that it leaves none behind. Header only, like skip.h. Any thread.
 */
#ifndef DLSHARE_TEST_FDS_H
#define DLSHARE_TEST_FDS_H

#include <dirent.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

/* Open fds of process pid (for this process, without the one that reads
 * the directory), or -1 when /proc/PID/fd cannot be read. */
static inline int fds_count(pid_t pid)
{
	char p[64];
	DIR *dd;
	struct dirent *de;
	int n = 0;

	snprintf(p, sizeof(p), "/proc/%d/fd", (int)pid);
	dd = opendir(p);
	if (!dd)
		return -1;
	while ((de = readdir(dd)))
		if (de->d_name[0] != '.')
			n++;
	closedir(dd);
	return n - (pid == getpid());
}

#endif
