#!/bin/sh
# test_containers.sh MODE DLSHARED DLSHARECTL [FAKECUDA PYTHON PYTHONPATH]
#
# dlshare across container boundaries, with the namespaces a container
# runtime would make, made here by unshare(1) (docs/containers.md says what
# each part shows):
#
#   namespaces  a consumer in its own PID, IPC, mount and network namespaces
#               reaches the daemon through the socket directory bind-mounted
#               at /run/dlshare (found by the default path rule), reads host
#               tensors bit-exact and publishes its own; the daemon sees the
#               consumer's real uid (SO_PEERCRED) for the ACL.
#   userns      user namespaces: a consumer that is root in its own user
#               namespace is its outer uid to the daemon; a daemon inside a
#               user namespace sees every peer whose uid it does not map as
#               the overflow uid (65534), all of them alike.
#   cuda-ipc    a legacy CUDA IPC tensor (tests/fakecuda, whose handles name
#               the exporter's pid as the driver's do) opens in the
#               producer's PID namespace, and in a consumer's own one fails
#               with an error that names the namespace as the likely cause.
#               With the Python binding of PYTHONPATH under PYTHON.
#
# Needs root (to make the namespaces and to be other uids with setpriv);
# exits 77 (skipped) saying why when it is not, or when the kernel refuses
# a namespace.
set -eu

mode=$1 dlshared=$2 ctl=$3
UID_A=1234      # a user of the host with no name: uids need none
UID_B=5678

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] ||
	skip "needs root: making PID/IPC/mount/network namespaces and running as other uids (unshare, setpriv)"
for p in unshare setpriv cmp; do
	command -v $p >/dev/null 2>&1 || skip "no $p here"
done

tmp=$(mktemp -d /tmp/dlshare-ns-XXXXXX)
chmod 0755 "$tmp"
# What the container's processes write (as any uid).
mkdir -m 0777 "$tmp/w"
# The directory a container gets bind-mounted: only the socket is in it.
sockdir=$tmp/run
mkdir -m 0755 "$sockdir"
sock=$sockdir/dlshared.sock
daemon=

cleanup() {
	if [ -n "$daemon" ]; then
		kill -KILL "$daemon" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

as() { # as UID CMD...: runs CMD as uid (and gid) UID, with no groups
	u=$1; shift
	setpriv --reuid "$u" --regid "$u" --clear-groups "$@"
}

# start_daemon [WRAPPER...]: dlshared on $sock, open to every uid (the ACL
# on each name is what this test looks at, not the socket's mode).
start_daemon() {
	"$@" "$dlshared" --config /dev/null --socket "$sock" --socket-mode 0666 \
		2>"$tmp/daemon.log" &
	daemon=$!
	# Serving once it answers: the socket file comes before listen().
	i=0
	until "$ctl" --socket "$sock" stats >/dev/null 2>&1; do
		i=$((i + 1))
		[ $i -lt 500 ] || { cat "$tmp/daemon.log"; fail "the daemon did not start"; }
		kill -0 "$daemon" 2>/dev/null ||
			{ cat "$tmp/daemon.log"; fail "the daemon died"; }
		sleep 0.02
	done
}

stop_daemon() {
	kill -TERM "$daemon"
	st=0
	wait "$daemon" || st=$?
	daemon=
	[ $st -eq 0 ] || { cat "$tmp/daemon.log"; fail "the daemon exited with $st"; }
	rm -f "$sock"
}

ctl() { "$ctl" --socket "$sock" "$@"; }

# owner UID NAME: the owner uid the daemon recorded for NAME, asked by UID.
owner() {
	as "$1" "$ctl" --socket "$sock" --json stat "$2" |
		sed -n 's/.*"owner_uid":\([0-9]*\).*/\1/p'
}

# Random contents, with sizes that are not a page multiple.
head -c 300007 /dev/urandom >"$tmp/host.bin"
head -c 70001 /dev/urandom >"$tmp/ctr.bin"
chmod 0644 "$tmp/host.bin" "$tmp/ctr.bin"
for ns in pid ipc mnt net user; do
	readlink "/proc/self/ns/$ns" >"$tmp/host-ns-$ns"
done

# What runs in the "container": checks that it really is in namespaces of
# its own, mounts the host's socket directory where the default path rule
# looks first, then does what the caller's script ($1) says.
cat >"$tmp/container.sh" <<'EOF'
set -eu
fail() { echo "FAIL (in the container): $*"; exit 1; }
for ns in $NEW_NS; do
	[ "$(readlink /proc/self/ns/$ns)" != "$(cat "$T/host-ns-$ns")" ] ||
		fail "still in the host's $ns namespace"
done
[ $$ -eq 1 ] || fail "not pid 1 of a new PID namespace (pid $$)"
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir /run/dlshare
mount --bind "$SOCKDIR" /run/dlshare
unset DLSHARE_SOCKET XDG_RUNTIME_DIR
[ "$(ls /run/dlshare)" = dlshared.sock ] || fail "the bind mount shows $(ls /run/dlshare)"
. "$T/$1"
EOF

# in_container SCRIPT [PREFIX...]: runs SCRIPT (in $tmp) in a new PID, IPC,
# mount and network namespace, after PREFIX (e.g. setpriv), as a
# container runtime would: /proc of its own, private mounts.
in_container() {
	script=$1; shift
	env T="$tmp" SOCKDIR="$sockdir" CTL="$ctl" UID_A=$UID_A \
		NEW_NS="${NEW_NS:-pid ipc mnt net}" \
		"$@" unshare --pid --fork --mount-proc --ipc --net --mount \
		--propagation private sh "$tmp/container.sh" "$script"
}

probe_namespaces() {
	unshare --pid --fork --mount-proc --ipc --net --mount true 2>"$tmp/probe" ||
		skip "the kernel refuses new PID/IPC/mount/network namespaces here: $(cat "$tmp/probe")"
}

case $mode in
namespaces)
	probe_namespaces
	start_daemon
	echo "== a consumer in its own PID, IPC, mount and network namespaces"
	ctl put ns/host "$tmp/host.bin" --dtype uint8 --shape 300007 --mode 0600 >/dev/null
	cat >"$tmp/consumer.sh" <<'EOF'
# Root here is root to the daemon: it reads root's 0600 name, bit-exact.
"$CTL" cat ns/host >"$T/w/got-host"
# Another uid is that uid to the daemon: refused.
if setpriv --reuid "$UID_A" --regid "$UID_A" --clear-groups \
		"$CTL" cat ns/host >/dev/null 2>"$T/w/denied"; then
	fail "uid $UID_A read root's 0600 name"
fi
# What that uid publishes is its own.
setpriv --reuid "$UID_A" --regid "$UID_A" --clear-groups \
	"$CTL" put ns/container "$T/ctr.bin" --dtype uint8 --shape 70001 --mode 0600 >/dev/null
echo "container: done"
EOF
	in_container consumer.sh >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "the container's consumer"; }
	cat "$tmp/out"
	cmp "$tmp/host.bin" "$tmp/w/got-host" || fail "the container read other bytes"
	grep -q "permission denied" "$tmp/w/denied" ||
		{ cat "$tmp/w/denied"; fail "uid $UID_A was not refused with 'permission denied'"; }
	echo "ok"

	echo "== the daemon saw the container's real uid"
	[ "$(owner $UID_A ns/container)" = "$UID_A" ] ||
		fail "ns/container is owned by '$(owner $UID_A ns/container)', not uid $UID_A"
	as $UID_A "$ctl" --socket "$sock" cat ns/container >"$tmp/got-ctr"
	cmp "$tmp/ctr.bin" "$tmp/got-ctr" || fail "the host read other bytes"
	# Root is not special: the 0600 name is uid A's alone.
	if ctl cat ns/container >/dev/null 2>&1; then
		fail "root read uid $UID_A's 0600 name"
	fi
	stop_daemon
	echo "ok"
	;;
userns)
	probe_namespaces
	as $UID_A unshare --user --map-root-user true 2>"$tmp/probe" ||
		skip "the kernel refuses a user namespace to an unprivileged user (unshare -U): $(cat "$tmp/probe")"
	start_daemon
	ctl put ns/host "$tmp/host.bin" --dtype uint8 --shape 300007 --mode 0600 >/dev/null
	as $UID_A "$ctl" --socket "$sock" put ns/a "$tmp/ctr.bin" \
		--dtype uint8 --shape 70001 --mode 0600 >/dev/null

	echo "== a consumer that is root in its own user namespace (uid $UID_A outside)"
	cat >"$tmp/userns.sh" <<'EOF'
[ "$(id -u)" = 0 ] || fail "not root in the user namespace"
# Root in here is uid A to the daemon: root's 0600 name stays closed...
if "$CTL" cat ns/host >/dev/null 2>"$T/w/denied"; then
	fail "root of a user namespace read the host root's 0600 name"
fi
# ...uid A's own opens...
"$CTL" cat ns/a >"$T/w/got-a"
# ...and what it publishes is uid A's.
"$CTL" put ns/userns "$T/host.bin" --dtype uint8 --shape 300007 >/dev/null
echo "container: done"
EOF
	NEW_NS="pid ipc mnt net user" in_container userns.sh \
		setpriv --reuid $UID_A --regid $UID_A --clear-groups \
		unshare --user --map-root-user >"$tmp/out" 2>&1 ||
		{ cat "$tmp/out"; fail "the consumer in the user namespace"; }
	cat "$tmp/out"
	grep -q "permission denied" "$tmp/w/denied" ||
		{ cat "$tmp/w/denied"; fail "not refused with 'permission denied'"; }
	cmp "$tmp/ctr.bin" "$tmp/w/got-a" || fail "the user namespace read other bytes"
	[ "$(owner $UID_A ns/userns)" = "$UID_A" ] ||
		fail "ns/userns is owned by '$(owner $UID_A ns/userns)', not the outer uid $UID_A"
	stop_daemon
	echo "ok"

	echo "== a daemon inside a user namespace that maps only root"
	# Like a rootless container's daemon, or PrivateUsers=yes: every peer
	# whose uid is not mapped is the overflow uid to it, all alike.
	overflow=$(cat /proc/sys/kernel/overflowuid 2>/dev/null || echo 65534)
	start_daemon unshare --user --map-root-user
	ctl put ns/root "$tmp/ctr.bin" --dtype uint8 --shape 70001 --mode 0600 >/dev/null
	[ "$(owner 0 ns/root)" = 0 ] || fail "root (mapped) is '$(owner 0 ns/root)' to it"
	as $UID_A "$ctl" --socket "$sock" put ns/a "$tmp/ctr.bin" \
		--dtype uint8 --shape 70001 --mode 0600 >/dev/null
	[ "$(owner $UID_A ns/a)" = "$overflow" ] ||
		fail "unmapped uid $UID_A is '$(owner $UID_A ns/a)' to it, not $overflow"
	# So uid B reads uid A's 0600 name: the ACL cannot tell them apart.
	as $UID_B "$ctl" --socket "$sock" cat ns/a >"$tmp/got-b" ||
		fail "uid $UID_B, also $overflow to the daemon, could not read ns/a"
	cmp "$tmp/ctr.bin" "$tmp/got-b" || fail "uid $UID_B read other bytes"
	stop_daemon
	echo "ok"
	;;
cuda-ipc)
	fakecuda=${4:-} python=${5:-} pypath=${6:-}
	[ -z "${DLSHARE_TEST_CUDA_SKIP:-}" ] || skip "$DLSHARE_TEST_CUDA_SKIP"
	[ -n "$fakecuda" ] && [ -e "$fakecuda" ] ||
		skip "no CUDA test double (tests/fakecuda needs the CUDA toolkit's headers)"
	[ -n "$python" ] && [ -d "$pypath/dlshare" ] || skip "no Python binding built"
	probe_namespaces
	start_daemon
	export DLSHARE_CUDA_RUNTIME="$fakecuda" DLSHARE_CUDA_DRIVER="$fakecuda"
	export PYTHONPATH="$pypath" DLSHARE_SOCKET="$sock" PYTHONDONTWRITEBYTECODE=1
	export FAKECUDA="$fakecuda" PYTHON="$python"
	# In the ASan build: an uninstrumented python loads the extension
	# with the sanitizer's runtime preloaded (as tests/python does).
	py() {
		if [ -n "${DLSHARE_TEST_PRELOAD:-}" ]; then
			env LD_PRELOAD="$DLSHARE_TEST_PRELOAD" \
				ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 "$PYTHON" "$@"
		else
			"$PYTHON" "$@"
		fi
	}
	# The producer exports cudaMalloc memory (cuda-ipc) and stays: legacy
	# IPC memory lives only as long as its exporter.
	cat >"$tmp/producer.py" <<'EOF2'
import ctypes, os, sys, dlshare
fc = ctypes.CDLL(os.environ["FAKECUDA"])
fc.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
fc.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int), ("device_id", ctypes.c_int32)]
class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]
class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]
class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]
new = ctypes.pythonapi.PyCapsule_New
new.restype = ctypes.py_object
new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
vals = (ctypes.c_int32 * 4)(7, -1, 1 << 30, 42)
p = ctypes.c_void_p()
assert fc.cudaMalloc(ctypes.byref(p), ctypes.sizeof(vals)) == 0
assert fc.cudaMemcpy(p, vals, ctypes.sizeof(vals), 1) == 0
shape = (ctypes.c_int64 * 1)(4)
mt = DLManagedTensor()
mt.dl_tensor = DLTensor(p, DLDevice(2, 0), 1, DLDataType(0, 32, 1), shape, None, 0)
cap = new(ctypes.addressof(mt), b"dltensor", None)
with dlshare.Client() as c:
    c.publish("ns/gpu", cap, stream=None)
    assert c.stat("ns/gpu").kind == "cuda-ipc", c.stat("ns/gpu").kind
    print("published", flush=True)
    sys.stdin.readline()
    assert fc.cudaDeviceSynchronize() == 0
EOF2
	cat >"$tmp/consumer.py" <<'EOF2'
import sys, dlshare
with dlshare.Client() as c:
    try:
        t = c.get("ns/gpu")
    except dlshare.Error as e:
        print("error:", e)
        sys.exit(3)
    print("opened", t.device)
EOF2
	mkfifo "$tmp/hold"
	py "$tmp/producer.py" <"$tmp/hold" >"$tmp/producer.out" 2>&1 &
	producer=$!
	exec 3>"$tmp/hold"
	i=0
	until grep -q published "$tmp/producer.out"; do
		i=$((i + 1))
		[ $i -lt 1000 ] && kill -0 $producer 2>/dev/null ||
			{ cat "$tmp/producer.out"; fail "the producer did not publish"; }
		sleep 0.02
	done

	echo "== a consumer in the producer's PID namespace opens it"
	py "$tmp/consumer.py" >"$tmp/host.out" 2>&1 ||
		{ cat "$tmp/host.out"; fail "the host's consumer"; }
	cat "$tmp/host.out"
	echo "ok"

	echo "== a consumer in its own PID and IPC namespace gets an error naming why"
	cat >"$tmp/gpu.sh" <<'EOF2'
# The container's own /dev/shm, as without --ipc=host.
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
export DLSHARE_SOCKET=/run/dlshare/dlshared.sock
st=0
if [ -n "${DLSHARE_TEST_PRELOAD:-}" ]; then
	env LD_PRELOAD="$DLSHARE_TEST_PRELOAD" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
		"$PYTHON" "$T/consumer.py" >"$T/w/ctr.out" 2>&1 || st=$?
else
	"$PYTHON" "$T/consumer.py" >"$T/w/ctr.out" 2>&1 || st=$?
fi
[ $st -eq 3 ] || { cat "$T/w/ctr.out"; fail "exit $st: the handle opened, or another failure"; }
EOF2
	in_container gpu.sh >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "the container's consumer"; }
	cat "$tmp/w/ctr.out"
	grep -q "is the consumer in another PID/IPC namespace than the producer" "$tmp/w/ctr.out" &&
		grep -q "use cuda-vmm" "$tmp/w/ctr.out" ||
		fail "the error does not name the namespaces as the likely cause"
	echo done >&3
	exec 3>&-
	st=0
	wait $producer || st=$?
	[ $st -eq 0 ] || { cat "$tmp/producer.out"; fail "the producer exited with $st"; }
	stop_daemon
	echo "ok"
	;;
*)
	fail "unknown mode $mode"
	;;
esac
