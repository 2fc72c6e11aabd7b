// test_libtorch — dlshare tensors handed to libtorch (Debian's libtorch-dev
// 1.13) with at::fromDLPack, as a C++ inference server would: every dtype
// libtorch takes, bool through the uint8 recipe, zero-size and 0-d tensors,
// strided views (export mode keeps the producer's strides), tensors kept
// after their producer exited and after their names were removed, values
// checked bit for bit, and the daemon's lease count back at 0 once libtorch
// dropped them (its deleters run, also for a zero-size tensor). Also runs
// examples/torch_consumer.cpp against the daemon.
//
// Built only where libtorch-dev is installed; elsewhere a stand-in says
// "skipped" (tests/integration/CMakeLists.txt).
#include <csetjmp>
#include <cstdarg>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>

// Debian's cmocka.h has no extern "C" of its own.
extern "C" {
#include <cmocka.h>

#include "harness.h"
}

namespace {

constexpr uint8_t dl_bool = 6; // DLPack 0.8's kDLBool; libtorch 1.13's
			       // dlpack.h predates it

struct dtype_case {
	const char *name;
	DLDataType dt;
	at::ScalarType want;
};

const dtype_case dtypes[] = {
	{ "float16", { kDLFloat, 16, 1 }, at::kHalf },
	{ "bfloat16", { kDLBfloat, 16, 1 }, at::kBFloat16 },
	{ "float32", { kDLFloat, 32, 1 }, at::kFloat },
	{ "float64", { kDLFloat, 64, 1 }, at::kDouble },
	{ "int8", { kDLInt, 8, 1 }, at::kChar },
	{ "int16", { kDLInt, 16, 1 }, at::kShort },
	{ "int32", { kDLInt, 32, 1 }, at::kInt },
	{ "int64", { kDLInt, 64, 1 }, at::kLong },
	{ "uint8", { kDLUInt, 8, 1 }, at::kByte },
	{ "complex64", { kDLComplex, 64, 1 }, at::kComplexFloat },
	{ "complex128", { kDLComplex, 128, 1 }, at::kComplexDouble },
};

// The values every 3x4 tensor holds: 0..11 in its own dtype (complex: as
// the real part), written by libtorch in the producer.
at::Tensor expected(at::ScalarType st)
{
	return at::arange(12, at::kDouble).reshape({ 3, 4 }).to(st);
}

int store(dlshare_client *c, const char *name, DLDataType dt,
	  std::vector<int64_t> shape, const at::Tensor &values)
{
	dlshare_tensor_spec spec = { nullptr, dt, (int32_t)shape.size(),
				     shape.data() };
	dlshare_writer *w;
	int err = dlshare_create(c, name, &spec, 1, nullptr, &w);

	if (err)
		return err;
	DLTensor *t = dlshare_writer_tensor(w, 0);
	if (values.numel())
		std::memcpy(t->data, values.contiguous().data_ptr(),
			    values.nbytes());
	return dlshare_seal(w, nullptr, nullptr);
}

// The producer (a child process): publishes and waits until told to exit.
int producer(const daemon_proc *d, int go)
{
	dlshare_client *c;
	char byte;

	if (dlshare_connect(d->sock, &c))
		return 10;
	for (const auto &k : dtypes) {
		std::string n = std::string("t/") + k.name;

		if (store(c, n.c_str(), k.dt, { 3, 4 }, expected(k.want)))
			return 11;
	}
	if (store(c, "t/empty", { kDLFloat, 32, 1 }, { 0, 5 }, at::Tensor()) ||
	    store(c, "t/empty0", { kDLInt, 64, 1 }, { 0 }, at::Tensor()) ||
	    store(c, "t/scalar", { kDLFloat, 64, 1 }, {},
		  at::full({}, 42.5, at::kDouble)) ||
	    store(c, "t/bool", { dl_bool, 8, 1 }, { 5 },
		  at::tensor({ 0, 1, 0, 0, 1 }, at::kByte)))
		return 12;
	if (write(go, "r", 1) != 1 || read(go, &byte, 1) != 1)
		return 13;
	dlshare_disconnect(c);
	return 0;
}

DLManagedTensor *get(dlshare_client *c, const char *name)
{
	DLManagedTensor *t = nullptr;

	assert_int_equal(dlshare_get_tensor(c, name, nullptr, &t), 0);
	// Never NULL, also for no bytes: libtorch would never run the
	// deleter of a NULL one, and the lease would leak.
	assert_non_null(t->dl_tensor.data);
	return t;
}

struct views {
	std::vector<at::Tensor> typed;
	at::Tensor empty, empty0, scalar, mask;
};

void check(const views &v)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++) {
		const at::Tensor &x = v.typed[i];

		assert_true(x.scalar_type() == dtypes[i].want);
		assert_true(x.equal(expected(dtypes[i].want)));
	}
	assert_true(v.empty.numel() == 0 && v.empty.dim() == 2 &&
		    v.empty.size(1) == 5);
	assert_true(v.empty0.numel() == 0 && v.empty0.dim() == 1);
	assert_int_equal(v.scalar.dim(), 0);
	assert_true(v.scalar.item<double>() == 42.5);
	assert_true(v.mask.equal(
		at::tensor({ 0, 1, 0, 0, 1 }, at::kByte).to(at::kBool)));
}

// One of the dlshare_host_alloc tensor's views, to publish: it shares the
// allocation and holds the one reference on it.
struct strided_view {
	DLManagedTensor m;
	int64_t shape[2], strides[2];
	DLManagedTensor *base;
};

void strided_view_free(DLManagedTensor *self)
{
	auto *v = reinterpret_cast<strided_view *>(self);

	v->base->deleter(v->base);
	delete v;
}

void strided(dlshare_client *c)
{
	int64_t shape[2] = { 4, 6 };
	// The transpose, and every other column: strides, no copy.
	const int64_t layouts[2][4] = { { 6, 4, 1, 6 }, { 4, 3, 6, 2 } };
	const at::Tensor whole = at::arange(24, at::kFloat).reshape({ 4, 6 });
	const at::Tensor want[2] = { whole.t(), whole.slice(1, 0, 6, 2) };

	for (int k = 0; k < 2; k++) {
		auto *v = new strided_view();
		DLManagedTensor *one = &v->m, *got;
		std::string n = "t/strided" + std::to_string(k);

		// Each view owns an allocation of its own.
		assert_int_equal(dlshare_host_alloc({ kDLFloat, 32, 1 }, 2,
						    shape, &v->base), 0);
		auto *f = static_cast<float *>(v->base->dl_tensor.data);
		for (int i = 0; i < 24; i++)
			f[i] = (float)i;
		v->shape[0] = layouts[k][0];
		v->shape[1] = layouts[k][1];
		v->strides[0] = layouts[k][2];
		v->strides[1] = layouts[k][3];
		v->m.dl_tensor = v->base->dl_tensor;
		v->m.dl_tensor.shape = v->shape;
		v->m.dl_tensor.strides = v->strides;
		v->m.deleter = strided_view_free;
		dlshare_publish_opts o = {};
		o.flags = DLSHARE_PUBLISH_NO_COPY;
		assert_int_equal(dlshare_publish(c, n.c_str(), &one, 1, &o,
						 nullptr), 0);
		got = get(c, n.c_str());
		assert_non_null(got->dl_tensor.strides);
		at::Tensor x = at::fromDLPack(got);
		assert_true(x.strides()[0] == layouts[k][2] &&
			    x.strides()[1] == layouts[k][3]);
		assert_true(x.equal(want[k]));
		assert_int_equal(dlshare_delete(c, n.c_str()), 0);
	}
}

void run_example(const daemon_proc *d, const char *name)
{
	pid_t p = fork();
	int status;

	assert_true(p >= 0);
	if (p == 0) {
		setenv("DLSHARE_SOCKET", d->sock, 1);
		execl(EXAMPLE_TORCH_CONSUMER, EXAMPLE_TORCH_CONSUMER, name, "1",
		      (char *)nullptr);
		_exit(127);
	}
	assert_int_equal(waitpid(p, &status, 0), p);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

void libtorch_consumer(void **)
{
	daemon_proc d;
	int go[2];
	views v;

	assert_int_equal(harness_daemon_start(&d, nullptr), 0);
	dlshare_client *c = harness_connect(&d);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, go),
			 0);
	pid_t p = harness_fork();
	if (p == 0)
		_exit(producer(&d, go[1]));
	char byte;
	assert_int_equal(read(go[0], &byte, 1), 1);

	for (const auto &k : dtypes)
		v.typed.push_back(at::fromDLPack(
			get(c, (std::string("t/") + k.name).c_str())));
	v.empty = at::fromDLPack(get(c, "t/empty"));
	v.empty0 = at::fromDLPack(get(c, "t/empty0"));
	v.scalar = at::fromDLPack(get(c, "t/scalar"));
	// libtorch 1.13 refuses kDLBool, and keeps nothing of a tensor it
	// refused; the recipe: the same bytes as uint8, viewed as bool.
	DLManagedTensor *b = get(c, "t/bool");
	bool refused = false;
	try {
		(void)at::fromDLPack(b);
	} catch (const c10::Error &) {
		refused = true;
	}
	assert_true(refused);
	b->dl_tensor.dtype.code = kDLUInt;
	v.mask = at::fromDLPack(b).view(at::kBool);
	check(v);

	// Kept after the producer exited, and after its names were removed.
	assert_int_equal(write(go[0], "x", 1), 1);
	assert_int_equal(harness_wait(p), 0);
	close(go[0]);
	close(go[1]);
	check(v);
	for (const auto &k : dtypes)
		assert_int_equal(dlshare_delete(c, (std::string("t/") +
						    k.name).c_str()), 0);
	assert_int_equal(dlshare_delete(c, "t/empty"), 0);
	assert_int_equal(dlshare_delete(c, "t/empty0"), 0);
	assert_int_equal(dlshare_delete(c, "t/scalar"), 0);
	check(v);
	dlshare_stats st;
	assert_int_equal(dlshare_stats_get(c, &st), 0);
	assert_int_equal(st.leases, sizeof(dtypes) / sizeof(dtypes[0]) + 4);

	strided(c);
	run_example(&d, "t/bool");

	// libtorch drops them: every deleter runs, every lease goes (the
	// zero-size ones too).
	v = views();
	assert_int_equal(harness_wait_stats(c, 0, -1, nullptr), 0);
	dlshare_disconnect(c);
	assert_int_equal(harness_daemon_stop(&d), 0);
}

} // namespace

int main()
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(libtorch_consumer),
	};

	return cmocka_run_group_tests_name("libtorch", tests, nullptr, nullptr);
}
