/* config — dlshare-relay's settings: the option table, the command line
 * and the INI file (--config) it reads. Main thread, before the loop. */
#ifndef DLSHARE_RELAY_CONFIG_H
#define DLSHARE_RELAY_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#define RELAY_MAX_CONNECT 16     /* --connect peers */
#define RELAY_MAX_MIRROR 16      /* --mirror prefixes per --connect */

/* How device versions travel (--gpu-path). */
enum {
	GPU_PATH_AUTO,    /* direct where both relays can, else staged */
	GPU_PATH_DIRECT,  /* as auto, but this UCX must be CUDA-aware */
	GPU_PATH_STAGE,   /* always staged through pinned host memory */
};

struct relay_peer_cfg {
	char *addr;                      /* ADDR:PORT as given */
	char *prefix[RELAY_MAX_MIRROR];
	int nprefix;
};

struct relay_config {
	char *socket_path;       /* NULL: dlshare_socket_path() */
	char *listen;            /* ADDR:PORT or NULL */
	char *key_file;
	uint32_t mode;           /* of mirrored names; 0: the daemon's default */
	char *node_name;         /* NULL: the host name */
	char *device_str;        /* --device: "cpu" (NULL) or "cuda:N" */
	int device;              /* mirrored device versions: -1 host, else
				  * this GPU ordinal */
	char *gpu_path_str;      /* --gpu-path: "auto" (NULL), "direct",
				  * "stage" */
	int gpu_path;            /* GPU_PATH_* */
	uint64_t chunk_size;     /* bytes per ucp_get_nbx */
	uint64_t inline_max;     /* a version's bytes an offer may carry */
	uint32_t max_inflight;   /* outstanding gets, all pulls together */
	uint32_t stage_slots;    /* pinned chunks staging one device offer */
	uint32_t max_peers;      /* connections accepted on --listen */
	uint32_t max_subscriptions; /* prefixes one peer may follow */
	uint64_t max_message;    /* bytes of one relay message */
	uint32_t scan_interval_ms;
	uint32_t auth_timeout_ms;
	uint32_t transfer_timeout_ms;
	uint32_t reconnect_max_ms;
	uint32_t auth_log_per_min; /* failed-auth log lines a minute */
	char *metrics_file;      /* NULL: no metrics written */
	uint32_t metrics_interval_s;
	struct relay_peer_cfg peers[RELAY_MAX_CONNECT];
	int npeers;
};

void config_init(struct relay_config *c);
void config_deinit(struct relay_config *c);

/* Reads the command line (and the --config file it names, whose values the
 * command line overrides). Returns 0 to run, 1 when --help or --version was
 * printed to out, or -1 after a message on err. */
int config_parse(struct relay_config *c, int argc, char **argv, FILE *out,
		 FILE *err);

/* Splits "ADDR:PORT" ("[v6]:PORT") into host and port. Returns 0 or -1. */
int config_split_addr(const char *s, char *host, size_t hostlen,
		      uint16_t *port);

#endif
