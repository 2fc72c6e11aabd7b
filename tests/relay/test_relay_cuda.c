/* test_relay_cuda — device versions through the relays, on fakecuda (the
 * daemons, the relays and this process load it: DLSHARE_CUDA_DRIVER and
 * DLSHARE_CUDA_RUNTIME). A device state dict published on A is staged by
 * A's relay through pinned host chunks and arrives on B bit-exact, as host
 * tensors (docs/protocol.md, "Device versions"); a serving relay killed
 * mid-transfer leaves nothing partial on B and no lease on A; a relay
 * without a CUDA runtime refuses device versions with a log line. The
 * helpers are test_relay.c's. */
#pragma GCC diagnostic ignored "-Wunused-function"
#define RELAY_NO_MAIN
#include "test_relay.c"

#include <inttypes.h>
#include <stdbool.h>

#include <cuda_runtime_api.h>

/* Publishes n uint8/float32 tensors (as publish()) as a device version on
 * A's GPU dev (this process's ordinal), filled from seed through host
 * copies. */
static uint64_t publish_dev_on(int dev, const char *name, size_t n,
			       const uint64_t *bytes, const char *const *keys,
			       uint32_t seed)
{
	dlshare_tensor_spec *spec = calloc(n, sizeof(*spec));
	int64_t *shape = calloc(n, sizeof(*shape));
	dlshare_create_opts co = { .device = { kDLCUDA, dev } };
	dlshare_writer *w;
	uint64_t v = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		spec[i].key = keys ? keys[i] : NULL;
		spec[i].dtype = (DLDataType){ kDLUInt, 8, 1 };
		spec[i].ndim = 1;
		shape[i] = (int64_t)bytes[i];
		spec[i].shape = &shape[i];
		if (i % 3 == 1 && bytes[i] % 4 == 0) {
			spec[i].dtype = (DLDataType){ kDLFloat, 32, 1 };
			shape[i] = (int64_t)bytes[i] / 4;
		}
	}
	assert_int_equal(dlshare_create(ca, name, spec, n, &co, &w), 0);
	for (i = 0; i < n; i++) {
		DLTensor *t = dlshare_writer_tensor(w, i);
		uint8_t *h = malloc(bytes[i] ? bytes[i] : 1);

		assert_int_equal(t->device.device_type, kDLCUDA);
		harness_fill(h, bytes[i], seed + (uint32_t)i);
		assert_int_equal(cudaMemcpy((uint8_t *)t->data + t->byte_offset,
					    h, bytes[i], cudaMemcpyHostToDevice),
				 cudaSuccess);
		free(h);
	}
	assert_int_equal(dlshare_seal(w, NULL, &v), 0);
	free(spec);
	free(shape);
	return v;
}

/* ... on GPU 0. */
static uint64_t publish_dev(const char *name, size_t n, const uint64_t *bytes,
			    const char *const *keys, uint32_t seed)
{
	return publish_dev_on(0, name, n, bytes, keys, seed);
}

/* A few hundred device tensors, tens of MiB (a few under sanitizers),
 * staged through A's ring of 4 slots of 1 MiB; then a second version. */
static void test_device_state_dict(void **state)
{
	size_t n = 300, i;
	uint64_t *bytes = calloc(n, sizeof(*bytes));
	char **keys = calloc(n, sizeof(*keys));
	uint64_t v;

	(void)state;
	for (i = 0; i < n; i++) {
		keys[i] = malloc(40);
		snprintf(keys[i], 40, "model.layers.%03zu.weight", i);
		/* 4 B .. ~256 KiB (~16 KiB under sanitizers), one empty */
		bytes[i] = i == 7 ? 0 : 4 * (1 + (i * 7919) %
					   (small ? 4096 : 65536));
	}
	a_chunk = "1M";
	start_all();
	relay_b = start_b_with(keyfile, "4M", "16");
	publish_dev("m/dev", n, bytes, (const char *const *)keys, 21);
	v = expect("m/dev", 0, n, bytes, (const char *const *)keys, 21);
	assert_true(log_has(log_a, "staged through 4 pinned chunks of 1048576"));
	{
		/* --device cpu (the default): host tensors on B */
		dlshare_bundle *b = NULL;

		assert_int_equal(dlshare_get(cb, "m/dev", NULL, &b), 0);
		assert_int_equal(dlshare_bundle_tensor(b, 0)->device.device_type,
				 kDLCPU);
		dlshare_bundle_free(b);
	}
	publish_dev("m/dev", n, bytes, (const char *const *)keys, 22);
	expect("m/dev", v, n, bytes, (const char *const *)keys, 22);
	assert_int_equal(wait_leases(ca, 0), 0);
	no_disconnects();
	log_lacks(log_a, "not offered");
	stop_all();
	a_chunk = "4M";
	for (i = 0; i < n; i++)
		free(keys[i]);
	free(keys);
	free(bytes);
}

/* Waits on B for a version of name newer than after, on B's GPU 0, and
 * checks it holds what publish_dev() wrote. Returns B's version. */
static uint64_t expect_dev(const char *name, uint64_t after, size_t n,
			   const uint64_t *bytes, uint32_t seed)
{
	dlshare_bundle *b = get_on_b(name, after, n);
	uint64_t v;
	size_t i;

	for (i = 0; i < n; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		uint8_t *want = malloc(bytes[i] ? bytes[i] : 1);
		uint8_t *got = malloc(bytes[i] ? bytes[i] : 1);

		assert_int_equal(t->device.device_type, kDLCUDA);
		assert_int_equal(t->device.device_id, 0);
		harness_fill(want, bytes[i], seed + (uint32_t)i);
		assert_int_equal(cudaMemcpy(got, (const uint8_t *)t->data +
					    t->byte_offset, bytes[i],
					    cudaMemcpyDeviceToHost), cudaSuccess);
		assert_memory_equal(got, want, bytes[i]);
		free(want);
		free(got);
	}
	v = dlshare_bundle_version(b);
	dlshare_bundle_free(b);
	return v;
}

/* --device cuda:0 on the mirror: the version is created on B's GPU,
 * pulled into B's pinned ring and copied host to device, slot by slot. */
static void test_device_to_device(void **state)
{
	size_t n = 200, i;
	uint64_t *bytes = calloc(n, sizeof(*bytes));
	uint64_t v;

	(void)state;
	for (i = 0; i < n; i++)
		bytes[i] = i == 3 ? 0 : 4 * (1 + (i * 104729) %
					   (small ? 4096 : 32768));
	a_chunk = "256K";
	start_all();
	relay_b = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			      "--mirror", "m/", "--key-file", keyfile,
			      "--device", "cuda:0", "--reconnect-max-ms", "200",
			      (char *)NULL);
	publish_dev("m/d2d", n, bytes, NULL, 51);
	v = expect_dev("m/d2d", 0, n, bytes, 51);
	publish_dev("m/d2d", n, bytes, NULL, 52);
	expect_dev("m/d2d", v, n, bytes, 52);
	assert_int_equal(wait_leases(ca, 0), 0);
	no_disconnects();
	stop_all();
	a_chunk = "4M";
	free(bytes);
}

/* --device takes cpu or cuda:N only, --gpu-path auto, direct or stage
 * (usage errors); --gpu-path direct on a UCX that is not CUDA-aware is a
 * startup error that says so. */
static void test_device_option(void **state)
{
	const char *const bad[3][3] = {
		{ "--device", "gpu0", "--device 'gpu0': not cpu or cuda:N" },
		{ "--gpu-path", "gpudirect", "--gpu-path 'gpudirect': not auto, "
		  "direct or stage" },
		{ "--gpu-path", "direct", "--gpu-path direct: this UCX" },
	};
	pid_t pid;
	int i;

	(void)state;
	start_all();
	for (i = 0; i < 3; i++) {
		pid = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
				  "--mirror", "m/", "--key-file", keyfile,
				  bad[i][0], bad[i][1], (char *)NULL);
		/* 2: a usage error; 1: could not start */
		assert_int_equal(harness_wait(pid), i < 2 ? 2 : 1);
		assert_true(log_has(log_b, bad[i][2]));
	}
	assert_true(log_has(log_b, "cannot register CUDA memory"));
	stop_all();
}

/* A mirror with --device cuda:0 pins at most its own --stage-slots x
 * --chunk-size: a peer's larger ring is refused, nothing published. */
static void test_device_ring_limit(void **state)
{
	uint64_t bytes[1] = { 8192 };

	(void)state;
	a_chunk = "1M";   /* A's ring: 4 MiB */
	start_all();
	relay_b = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			      "--mirror", "m/", "--key-file", keyfile,
			      "--device", "cuda:0", "--chunk-size", "256K",
			      "--stage-slots", "2", (char *)NULL);
	publish_dev("m/bigring", 1, bytes, NULL, 61);
	assert_true(log_has(log_b, "staging ring of 4194304 bytes exceeds "
			    "this relay's --stage-slots x --chunk-size, "
			    "524288 bytes"));
	no_partial_on_b("m/bigring");
	assert_int_equal(wait_leases(ca, 0), 0);
	stop_all();
	a_chunk = "4M";
}

/* B's daemon holds want buffers (a pending version holds one). */
static void wait_b_buffers(uint64_t want)
{
	dlshare_stats st;
	int i;

	for (i = 0; i < harness_ms(10000) / 5; i++) {
		assert_int_equal(dlshare_stats_get(cb, &st), 0);
		if (st.buffers == want)
			return;
		sleep_ms(5);
	}
	dump_logs();
	fail_msg("B holds %" PRIu64 " buffers, not %" PRIu64, st.buffers, want);
}

static pid_t start_b_dev(void)
{
	return relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			   "--mirror", "m/", "--key-file", keyfile,
			   "--device", "cuda:0", "--reconnect-max-ms", "200",
			   (char *)NULL);
}

/* Relays killed while a device version is staged (4 KiB slots, two of
 * them: thousands of chunks) into a device version on B: first the
 * mirroring one, then the serving one. Nothing partial on B (its pending
 * device buffer goes too), no lease on A; both back, the version arrives
 * whole. */
static void test_device_kill_mid_transfer(void **state)
{
	uint64_t bytes[2] = { small ? 2u << 20 : 16u << 20, 4096 };
	dlshare_stats st;

	(void)state;
	a_chunk = "4K";
	a_slots = "2";
	start_all();
	relay_b = start_b_dev();
	publish_dev("m/devslow", 2, bytes, NULL, 31);
	wait_b_buffers(1);     /* B took the offer: a pending version */
	crash(&relay_b);
	wait_b_buffers(0);
	no_partial_on_b("m/devslow");
	assert_int_equal(wait_leases(ca, 0), 0);
	assert_int_equal(dlshare_stats_get(cb, &st), 0);
	assert_int_equal(st.leases, 0);

	relay_b = start_b_dev();
	wait_b_buffers(1);
	crash(&relay_a);
	assert_true(log_has(log_b, "aborted, nothing published"));
	wait_b_buffers(0);
	no_partial_on_b("m/devslow");
	assert_int_equal(wait_leases(ca, 0), 0);

	a_chunk = "4M";
	a_slots = "4";
	relay_a = start_a();
	expect_dev("m/devslow", 0, 2, bytes, 31);
	assert_int_equal(wait_leases(ca, 0), 0);
	stop_all();
}

/* A relay that cannot load a CUDA runtime refuses device versions, says
 * why, and keeps serving host ones. */
static void test_device_without_cuda(void **state)
{
	uint64_t bytes[1] = { 4096 };

	(void)state;
	relay_runtime = "/nonexistent/libcudart.so";
	start_all();
	relay_runtime = NULL;
	relay_b = start_b_with(keyfile, "4M", "16");
	publish_dev("m/devnone", 1, bytes, NULL, 41);
	assert_true(log_has(log_a, "not offered: no CUDA runtime"));
	no_partial_on_b("m/devnone");
	publish("m/host", 1, bytes, NULL, 42);
	expect("m/host", 0, 1, bytes, NULL, 42);
	stop_all();
}

/* A CUDA error while A's relay stages a device version (fakecuda's
 * FAKECUDA_FAIL_D2H: its third device-to-host copy fails, once) is told to
 * B at once (ABORT, relay minor 7), not after --transfer-timeout-ms: B
 * aborts its pending device version and logs A's reason; no lease on A, no
 * buffer on B; the next version arrives whole. */
static void test_device_staging_error(void **state)
{
	uint64_t bytes[2] = { 64u << 10, 4096 };   /* 5 chunks of 16 KiB */
	char mf_a[160], mf_b[160], *t;

	(void)state;
	a_chunk = "16K";
	start_all();
	stop(&relay_a);
	snprintf(mf_a, sizeof(mf_a), "%s/relay-a.prom", A.dir);
	snprintf(mf_b, sizeof(mf_b), "%s/relay-b.prom", B.dir);
	a_metrics = mf_a;
	/* the environment of A's relay alone: the daemons are running, and
	 * this process does not read it again */
	setenv("FAKECUDA_FAIL_D2H", "3", 1);
	relay_a = start_a();
	unsetenv("FAKECUDA_FAIL_D2H");
	a_metrics = NULL;
	relay_b = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			      "--mirror", "m/", "--key-file", keyfile,
			      "--device", "cuda:0", "--reconnect-max-ms", "200",
			      "--metrics-file", mf_b, "--metrics-interval-s", "1",
			      (char *)NULL);
	publish_dev("m/fault", 2, bytes, NULL, 71);
	assert_true(log_has(log_a, "device-to-host copy on GPU 0: unspecified "
			    "launch failure"));
	assert_true(log_has(log_a, "staging failed; the peer is told"));
	assert_true(log_has(log_b, "aborted, nothing published: the origin "
			    "node-a aborted the transfer: device-to-host copy "
			    "on GPU 0: unspecified launch failure"));
	assert_true(log_has(log_a, "could not mirror m/fault"));
	wait_b_buffers(0);
	no_partial_on_b("m/fault");
	assert_int_equal(wait_leases(ca, 0), 0);
	/* the next version is mirrored normally, on the same connection */
	publish_dev("m/fault", 2, bytes, NULL, 72);
	expect_dev("m/fault", 0, 2, bytes, 72);
	assert_int_equal(wait_leases(ca, 0), 0);
	/* the metrics say which side failed and why */
	t = prom_wait(mf_a, "dlshare_relay_versions_served_total", 1);
	assert_int_equal(prom_value(t, "dlshare_relay_transfers_failed_total"
				    "{side=\"serve\",reason=\"staging\"}"), 1);
	assert_int_equal(prom_value(t, "dlshare_relay_transfers_failed_total"
				    "{side=\"serve\",reason=\"peer-failed\"}"), 0);
	assert_int_equal(prom_value(t, "dlshare_relay_served_bytes_total"),
			 (64u << 10) + 4096);
	free(t);
	t = prom_wait(mf_b, "dlshare_relay_versions_mirrored_total", 1);
	assert_int_equal(prom_value(t, "dlshare_relay_transfers_failed_total"
				    "{side=\"mirror\",reason=\"origin-abort\"}"),
			 1);
	assert_int_equal(prom_value(t, "dlshare_relay_transfers_failed_total"
				    "{side=\"mirror\",reason=\"other\"}"), 0);
	assert_int_equal(prom_value(t, "dlshare_relay_staging_slots_in_use"
				    "{side=\"mirror\"}"), 0);
	free(t);
	no_disconnects();
	log_lacks(log_a, "--transfer-timeout-ms");
	stop_all();
	a_chunk = "4M";
}

/* The same fault towards a mirror of relay minor 6, which knows no ABORT:
 * A sends none, says so, and --transfer-timeout-ms ends the offer as
 * before (the connection closed, the lease dropped). */
static void test_device_staging_error_minor6(void **state)
{
	uint64_t bytes[1] = { 64u << 10 };
	const char *const pfx[1] = { "m/" };
	struct old_mirror m;

	(void)state;
	a_chunk = "16K";
	a_timeout = "1000";
	start_all();
	stop(&relay_a);
	assert_int_equal(truncate(log_a, 0), 0);   /* for "listening on" */
	setenv("FAKECUDA_FAIL_D2H", "2", 1);
	relay_a = start_a();
	unsetenv("FAKECUDA_FAIL_D2H");
	assert_true(log_has(log_a, "listening on"));
	old_start(&m, 6, pfx, 1);
	publish_dev("m/fault6", 1, bytes, NULL, 75);
	assert_true(old_wait(&m, MSG_OFFER_STAGED));
	assert_true(log_has(log_a, "staging failed; the peer's relay "
			    "(protocol 1.6) cannot be told"));
	assert_false(old_wait(&m, MSG_ABORT));   /* A closes it instead */
	assert_true(log_has(log_a, "held the offer of m/fault6 for more than "
			    "--transfer-timeout-ms 1000"));
	assert_int_equal(wait_leases(ca, 0), 0);
	old_stop(&m);
	stop_all();
	a_chunk = "4M";
	a_timeout = "60000";
}

/* The UUID of this process's device ordinal dev. */
static void uuid_of(int dev, unsigned char out[16])
{
	struct cudaDeviceProp prop;

	assert_int_equal(cudaGetDeviceProperties(&prop, dev), cudaSuccess);
	memcpy(out, prop.uuid.bytes, 16);
}

/* GPUs other than 0, and a CUDA_VISIBLE_DEVICES that differs between the
 * processes (4 fakecuda devices; this process and the daemons see all):
 * the producer publishes on device 2; A's relay sees it as cuda:1
 * (CUDA_VISIBLE_DEVICES=1,2); B's relay mirrors to --device cuda:1 with
 * CUDA_VISIBLE_DEVICES=2,3, which is device 3 here. The version arrives
 * bit-exact on device 3 (its UUID, and where its memory is), and neither
 * relay made a context on its cuda:0. */
static void test_device_not_zero(void **state)
{
	uint64_t bytes[3] = { 8192, 0, 300000 };
	unsigned char want[16], got[16];
	struct cudaPointerAttributes pa;
	dlshare_bundle *b;
	size_t i;
	int ndev = 0;

	(void)state;
	assert_int_equal(cudaGetDeviceCount(&ndev), cudaSuccess);
	if (ndev < 4)
		test_skip("fakecuda shows %d devices, not FAKECUDA_DEVICES=4",
			  ndev);
	a_chunk = "64K";
	start_all();
	stop(&relay_a);
	/* each relay's cuda:0 is PROHIBITED in its own process (no context
	 * there): neither may touch a GPU it was not given */
	setenv("CUDA_VISIBLE_DEVICES", "1,2", 1);
	setenv("FAKECUDA_COMPUTE_MODE", "default,prohibited,default,default", 1);
	relay_a = start_a();
	setenv("CUDA_VISIBLE_DEVICES", "2,3", 1);
	setenv("FAKECUDA_COMPUTE_MODE", "default,default,prohibited,default", 1);
	relay_b = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			      "--mirror", "m/", "--key-file", keyfile,
			      "--device", "cuda:1", "--reconnect-max-ms", "200",
			      (char *)NULL);
	unsetenv("CUDA_VISIBLE_DEVICES");
	unsetenv("FAKECUDA_COMPUTE_MODE");
	publish_dev_on(2, "m/gpu2", 3, bytes, NULL, 81);
	b = get_on_b("m/gpu2", 0, 3);
	for (i = 0; i < 3; i++) {
		const DLTensor *t = dlshare_bundle_tensor(b, i);
		uint8_t *w = malloc(bytes[i] ? bytes[i] : 1);
		uint8_t *g = malloc(bytes[i] ? bytes[i] : 1);

		assert_int_equal(t->device.device_type, kDLCUDA);
		assert_int_equal(t->device.device_id, 3);
		if (bytes[i]) {
			assert_int_equal(cudaPointerGetAttributes(&pa, t->data),
					 cudaSuccess);
			assert_int_equal(pa.device, 3);
		}
		harness_fill(w, bytes[i], 81 + (uint32_t)i);
		assert_int_equal(cudaMemcpy(g, (const uint8_t *)t->data +
					    t->byte_offset, bytes[i],
					    cudaMemcpyDeviceToHost), cudaSuccess);
		assert_memory_equal(g, w, bytes[i]);
		free(w);
		free(g);
	}
	dlshare_bundle_free(b);
	uuid_of(3, want);
	uuid_of(pa.device, got);
	assert_memory_equal(got, want, 16);
	assert_true(log_has(log_a, "device versions of GPU 1 staged"));
	assert_int_equal(wait_leases(ca, 0), 0);
	no_disconnects();
	log_lacks(log_a, "not offered");
	stop_all();
	a_chunk = "4M";
}

/* ---- the direct path (relay minor 8, relay/direct.c) --------------------
 *
 * Debian's UCX is not CUDA-aware: DLSHARE_RELAY_DEVICE_MEMORY_IS_HOST=1 in
 * a relay's environment makes it call itself capable and register
 * fakecuda's device memory (host memory of its process) as host memory,
 * so that what travels and when is the direct path's. */

#define DIRECT_HOOK "DLSHARE_RELAY_DEVICE_MEMORY_IS_HOST"

/* Starts A's relay (stopping the one start_all made) with the hook set or
 * not, and --metrics-file mf. */
static void restart_a(bool capable, const char *mf)
{
	stop(&relay_a);
	assert_int_equal(truncate(log_a, 0), 0);   /* for "listening on" */
	a_metrics = mf;
	if (capable)
		setenv(DIRECT_HOOK, "1", 1);
	relay_a = start_a();
	unsetenv(DIRECT_HOOK);
	a_metrics = NULL;
	assert_true(log_has(log_a, "listening on"));
}

/* B's relay, capable or not, with --metrics-file mf, --device dev,
 * --chunk-size chunk and --max-inflight inflight. */
static pid_t start_b_direct(bool capable, const char *mf, const char *dev,
			    const char *chunk, const char *inflight)
{
	pid_t pid;

	if (capable)
		setenv(DIRECT_HOOK, "1", 1);
	pid = relay_start(log_b, "--socket", B.sock, "--connect", port_s,
			  "--mirror", "m/", "--key-file", keyfile,
			  "--device", dev, "--chunk-size", chunk,
			  "--max-inflight", inflight, "--reconnect-max-ms", "200",
			  "--metrics-file", mf, "--metrics-interval-s", "1",
			  (char *)NULL);
	unsetenv(DIRECT_HOOK);
	return pid;
}

/* The metrics files of A's and B's relays. */
static void prom_paths(char *mf_a, char *mf_b, size_t n)
{
	snprintf(mf_a, n, "%s/relay-a.prom", A.dir);
	snprintf(mf_b, n, "%s/relay-b.prom", B.dir);
}

/* Both daemons, and both relays capable, B's with --device dev,
 * --chunk-size chunk and --max-inflight inflight; their metrics files
 * into mf_a and mf_b (160 bytes). */
static void start_direct(char *mf_a, char *mf_b, const char *dev,
			 const char *chunk, const char *inflight)
{
	start_all();
	prom_paths(mf_a, mf_b, 160);
	restart_a(true, mf_a);
	relay_b = start_b_direct(true, mf_b, dev, chunk, inflight);
}

/* dlshare_relay_device_versions_total{side,path} in text. */
static double devv(const char *text, const char *side, const char *path)
{
	char series[160];

	snprintf(series, sizeof(series), "dlshare_relay_device_versions_total"
		 "{side=\"%s\",path=\"%s\"}", side, path);
	return prom_value(text, series);
}

/* Waits until A's and B's relays counted want device versions of path on
 * their side, and none of the other path. */
static void expect_paths(const char *mf_a, const char *mf_b, const char *path,
			 double want)
{
	const char *other = strcmp(path, "direct") ? "direct" : "stage";
	char series[160], *t;

	snprintf(series, sizeof(series), "dlshare_relay_device_versions_total"
		 "{side=\"serve\",path=\"%s\"}", path);
	t = prom_wait(mf_a, series, want);
	assert_int_equal(devv(t, "serve", other), 0);
	free(t);
	snprintf(series, sizeof(series), "dlshare_relay_device_versions_total"
		 "{side=\"mirror\",path=\"%s\"}", path);
	t = prom_wait(mf_b, series, want);
	assert_int_equal(devv(t, "mirror", other), 0);
	free(t);
}

/* A device state dict from GPU to GPU, both relays capable: A offers its
 * device memory (OFFER_DEVICE, no ring), B gets it in 64 KiB chunks
 * straight into a device version on its GPU and seals; bit-exact, twice,
 * and both relays' metrics say direct. */
static void test_direct_device_to_device(void **state)
{
	size_t n = 120, i;
	uint64_t *bytes = calloc(n, sizeof(*bytes)), total = 0;
	char mf_a[160], mf_b[160], *t;
	uint64_t v;

	(void)state;
	for (i = 0; i < n; i++) {
		bytes[i] = i == 5 ? 0 : 4 * (1 + (i * 7919) %
					   (small ? 8192 : 65536));
		total += bytes[i];
	}
	start_direct(mf_a, mf_b, "cuda:0", "64K", "4");
	publish_dev("m/direct", n, bytes, NULL, 91);
	v = expect_dev("m/direct", 0, n, bytes, 91);
	publish_dev("m/direct", n, bytes, NULL, 92);
	expect_dev("m/direct", v, n, bytes, 92);
	expect_paths(mf_a, mf_b, "direct", 2);
	t = prom_wait(mf_b, "dlshare_relay_gpu_direct_capable", 1);
	assert_int_equal(prom_value(t, "dlshare_relay_pulled_bytes_total"),
			 2 * total);
	free(t);
	t = prom_wait(mf_a, "dlshare_relay_gpu_direct_capable", 1);
	assert_int_equal(prom_value(t, "dlshare_relay_staging_slots_in_use"
				    "{side=\"serve\"}"), 0);
	free(t);
	assert_true(log_has(log_a, "device versions of GPU 0 go direct"));
	assert_true(log_has(log_b, "device versions go direct"));
	log_lacks(log_a, "pinned chunks");
	assert_int_equal(wait_leases(ca, 0), 0);
	no_disconnects();
	stop_all();
	free(bytes);
}

/* Direct from A's device memory into a host version on B (--device cpu):
 * the mirror's choice, as with staging. */
static void test_direct_to_host(void **state)
{
	uint64_t bytes[3] = { 300000, 0, 4096 };
	char mf_a[160], mf_b[160];

	(void)state;
	start_direct(mf_a, mf_b, "cpu", "16K", "2");
	publish_dev("m/dhost", 3, bytes, NULL, 93);
	expect("m/dhost", 0, 3, bytes, NULL, 93);
	{
		dlshare_bundle *b = NULL;

		assert_int_equal(dlshare_get(cb, "m/dhost", NULL, &b), 0);
		assert_int_equal(dlshare_bundle_tensor(b, 0)->device.device_type,
				 kDLCPU);
		dlshare_bundle_free(b);
	}
	expect_paths(mf_a, mf_b, "direct", 1);
	assert_int_equal(wait_leases(ca, 0), 0);
	no_disconnects();
	stop_all();
}

/* One relay capable, the other not, either way round, and a capable one
 * told --gpu-path stage: every device version is staged (CAPS says so),
 * bit-exact; the capable side logs why. */
static void test_direct_fallback(void **state)
{
	uint64_t bytes[2] = { 200000, 4096 };
	char mf_a[160], mf_b[160], *t;
	int round;

	(void)state;
	a_chunk = "64K";
	for (round = 0; round < 3; round++) {
		char name[32];

		start_all();
		prom_paths(mf_a, mf_b, sizeof(mf_a));
		a_gpu_path = round == 2 ? "stage" : "auto";
		restart_a(round != 1, mf_a);
		a_gpu_path = "auto";
		relay_b = start_b_direct(round != 0, mf_b, "cuda:0", "64K", "4");
		snprintf(name, sizeof(name), "m/fallback%d", round);
		publish_dev(name, 2, bytes, NULL, 94 + (uint32_t)round);
		expect_dev(name, 0, 2, bytes, 94 + (uint32_t)round);
		expect_paths(mf_a, mf_b, "stage", 1);
		t = prom_wait(mf_a, "dlshare_relay_gpu_direct_capable",
			      round == 0);
		free(t);
		t = prom_wait(mf_b, "dlshare_relay_gpu_direct_capable",
			      round != 0);
		free(t);
		assert_true(log_has(round == 0 ? log_a : log_b, "its relay "
				    "cannot get device memory"));
		assert_true(log_has(log_a, "pinned chunks"));
		assert_int_equal(wait_leases(ca, 0), 0);
		no_disconnects();
		stop_all();
	}
	a_chunk = "4M";
}

/* Stops (SIGSTOP) the relay *pid while B pulls name: B holds its pending
 * version (one buffer), A its lease, and nothing of name is sealed on B,
 * so the transfer really is in the middle (a pull that was over before
 * the stop fails here, loudly); then kills it. */
static void kill_mid_pull(pid_t *pid, const char *name)
{
	wait_b_buffers(1);
	wait_transfer();
	kill(*pid, SIGSTOP);
	assert_int_equal(leases_of(ca), 1);
	no_partial_on_b(name);
	crash(pid);
}

/* Relays killed mid-transfer on the direct path (4 KiB gets, one at a
 * time, into a device version on B): first the mirroring one, then the
 * serving one. Nothing partial on B (its pending device buffer goes), no
 * lease on A; both back, the version arrives whole. */
static void test_direct_kill_mid_transfer(void **state)
{
	uint64_t bytes[2] = { small ? 4u << 20 : 32u << 20, 4096 };
	char mf_a[160], mf_b[160], *t;

	(void)state;
	start_direct(mf_a, mf_b, "cuda:0", "4K", "1");
	publish_dev("m/dslow", 2, bytes, NULL, 97);
	kill_mid_pull(&relay_b, "m/dslow");
	wait_b_buffers(0);
	no_partial_on_b("m/dslow");
	assert_int_equal(wait_leases(ca, 0), 0);
	assert_int_equal(leases_of(cb), 0);

	relay_b = start_b_direct(true, mf_b, "cuda:0", "4K", "1");
	kill_mid_pull(&relay_a, "m/dslow");
	assert_true(log_has(log_b, "aborted, nothing published"));
	wait_b_buffers(0);
	no_partial_on_b("m/dslow");
	assert_int_equal(wait_leases(ca, 0), 0);

	/* both back: the version comes whole, directly */
	restart_a(true, mf_a);
	expect_dev("m/dslow", 0, 2, bytes, 97);
	t = prom_wait(mf_b, "dlshare_relay_device_versions_total"
		      "{side=\"mirror\",path=\"direct\"}", 1);
	free(t);
	assert_int_equal(wait_leases(ca, 0), 0);
	stop_all();
}

/* The origin deletes the name while B gets its device version directly:
 * the lease keeps A's device memory valid and unchanged, so the pull
 * completes bit-exact (nothing torn), the deletion is mirrored after it,
 * and no lease or pending buffer is left on either side. */
static void test_direct_deleted_during_pull(void **state)
{
	uint64_t bytes[1] = { small ? 4u << 20 : 32u << 20 };
	char mf_a[160], mf_b[160];

	(void)state;
	start_direct(mf_a, mf_b, "cuda:0", "4K", "1");
	publish_dev("m/dgone", 1, bytes, NULL, 98);
	wait_b_buffers(1);
	wait_transfer();
	assert_int_equal(dlshare_delete(ca, "m/dgone"), 0);
	expect_dev("m/dgone", 0, 1, bytes, 98);
	gone_on_b("m/dgone");
	wait_b_buffers(0);
	assert_int_equal(wait_leases(ca, 0), 0);
	assert_int_equal(leases_of(cb), 0);
	no_disconnects();
	stop_all();
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_device_state_dict),
		cmocka_unit_test(test_device_to_device),
		cmocka_unit_test(test_device_option),
		cmocka_unit_test(test_device_ring_limit),
		cmocka_unit_test(test_device_kill_mid_transfer),
		cmocka_unit_test(test_device_without_cuda),
		cmocka_unit_test(test_device_staging_error),
		cmocka_unit_test(test_device_staging_error_minor6),
		cmocka_unit_test(test_device_not_zero),
		cmocka_unit_test(test_direct_device_to_device),
		cmocka_unit_test(test_direct_to_host),
		cmocka_unit_test(test_direct_fallback),
		cmocka_unit_test(test_direct_kill_mid_transfer),
		cmocka_unit_test(test_direct_deleted_during_pull),
	};

	signal(SIGPIPE, SIG_IGN);
	return test_run_group("relay_cuda", tests, setup, NULL);
}
