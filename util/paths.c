/* paths — the default socket path rule. */
#include "paths.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

int paths_check_socket(const char *path)
{
	struct sockaddr_un sa;

	return strlen(path) < sizeof(sa.sun_path) ? 0 : -ENAMETOOLONG;
}

int paths_default_socket(char *buf, size_t len)
{
	const char *env = getenv("DLSHARE_SOCKET");
	int n;

	if (env && *env)
		n = snprintf(buf, len, "%s", env);
	else if (access(PATHS_SYSTEM_SOCKET, F_OK) == 0)
		n = snprintf(buf, len, "%s", PATHS_SYSTEM_SOCKET);
	else if ((env = getenv("XDG_RUNTIME_DIR")) && *env)
		n = snprintf(buf, len, "%s/dlshare/dlshared.sock", env);
	else
		n = snprintf(buf, len, "/tmp/dlshare-%u/dlshared.sock",
			     (unsigned)getuid());
	if (n < 0 || (size_t)n >= len)
		return -ENAMETOOLONG;
	return paths_check_socket(buf);
}
