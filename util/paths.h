/* paths — where dlshared listens when nobody says: the rule daemon and
 * clients share, so they find each other with no flags. Any thread. */
#ifndef DLSHARE_PATHS_H
#define DLSHARE_PATHS_H

#include <stddef.h>

#define PATHS_SYSTEM_SOCKET "/run/dlshare/dlshared.sock"

/* Writes the default socket path: $DLSHARE_SOCKET, else the system socket
 * when it exists, else $XDG_RUNTIME_DIR/dlshare/dlshared.sock, else
 * /tmp/dlshare-$UID/dlshared.sock. Returns 0, or -ENAMETOOLONG when it does
 * not fit in len bytes or in a sockaddr_un. */
int paths_default_socket(char *buf, size_t len);

/* Checks that path fits in a sockaddr_un (libuv would truncate it silently).
 * Returns 0 or -ENAMETOOLONG. */
int paths_check_socket(const char *path);

#endif
