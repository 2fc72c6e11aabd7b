// torch_consumer — a C++ program that hands dlshare tensors to libtorch.
//
//   example_torch_consumer [NAME] [COUNT]
//
// Follows NAME (default example/matrix) like example_consumer does, and
// turns each version into an at::Tensor with at::fromDLPack, without a
// copy: the tensor keeps the version's lease, and its deleter (run by
// libtorch when the last at::Tensor on it goes) releases it.
//
// Two things a libtorch consumer must know (libtorch 1.13, Debian 12):
// - the memory is read-only (a write kills the process with SIGSEGV): clone()
//   what you want to change;
// - libtorch 1.13 refuses kDLBool ("Unsupported code 6"): publish such data
//   as uint8, or, as below, relabel the DLPack dtype to uint8 and view the
//   at::Tensor as bool (same bytes, no copy).
//
// Build: g++ -std=c++17 torch_consumer.cpp $(pkg-config --cflags --libs dlshare)
//        -ltorch_cpu -lc10
#include <cstdio>
#include <cstdlib>

#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>

#include <dlshare/dlshare.h>

// DLPack's bool type code (0.8 and later); the dlpack.h of libtorch 1.13
// (and Debian's, 0.6) predates it.
constexpr uint8_t dl_bool = 6;

// A DLPack tensor from dlshare as an at::Tensor; takes t over (its deleter
// runs when libtorch is done with the memory).
static at::Tensor to_torch(DLManagedTensor *t)
{
	if (t->dl_tensor.dtype.code == dl_bool) {
		// kDLBool is DLPack's code 6, which libtorch 1.13 refuses:
		// the same bytes as uint8, viewed as bool.
		t->dl_tensor.dtype.code = kDLUInt;
		return at::fromDLPack(t).view(at::kBool);
	}
	return at::fromDLPack(t);
}

int main(int argc, char **argv)
{
	const char *name = argc > 1 ? argv[1] : "example/matrix";
	int count = argc > 2 ? std::atoi(argv[2]) : 3;
	dlshare_get_opts opts = { DLSHARE_NEWER_THAN, 0, 10000, nullptr };
	dlshare_client *c;
	int err;

	if ((err = dlshare_connect(nullptr, &c))) {
		std::fprintf(stderr, "%s: %s\n", dlshare_strerror(err),
			     dlshare_last_error());
		return 1;
	}
	for (int seen = 0; seen < count; seen++) {
		DLManagedTensor *t;
		dlshare_bundle *b;

		if ((err = dlshare_get(c, name, &opts, &b)))
			break;
		opts.version = dlshare_bundle_version(b);
		err = dlshare_bundle_export(b, 0, &t);
		dlshare_bundle_free(b); // the tensor keeps the lease
		if (err)
			break;
		try {
			at::Tensor x = to_torch(t);

			std::printf("%s version %llu: %s%s, sum %g\n", name,
				    (unsigned long long)opts.version,
				    x.toString().c_str(),
				    c10::str(x.sizes()).c_str(),
				    x.to(at::kDouble).sum().item<double>());
		} catch (const c10::Error &e) {
			std::fprintf(stderr, "libtorch refused it: %s\n",
				     e.what_without_backtrace());
			t->deleter(t);
			err = DLSHARE_ENOTSUP;
			break;
		}
	}
	if (err)
		std::fprintf(stderr, "get %s: %s: %s\n", name,
			     dlshare_strerror(err), dlshare_last_error());
	dlshare_disconnect(c);
	return err ? 1 : 0;
}
