#!/bin/sh
# test_install.sh BUILD_DIR SOURCE_DIR [CFLAGS]
#
# Installs the build into a temporary prefix (cmake --install --prefix),
# checks that everything an operator and a developer need is there, builds
# tests/service/consumer twice against the installed library (through
# pkg-config, and through CMake's find_package(dlshare)), and runs both
# against the installed daemon. CFLAGS (e.g. the sanitizer flags of the
# build) go to both consumer builds.
set -eu

build=$1 src=$2 cflags=${3:-}
cc=${CC:-cc}
tmp=$(mktemp -d /tmp/dlshare-install-XXXXXX)
prefix=$tmp/prefix
daemon=

cleanup() {
	if [ -n "$daemon" ]; then
		kill -KILL "$daemon" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

echo "== cmake --install --prefix $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log"; fail "cmake --install"; }

pc=$(find "$prefix" -name dlshare.pc | head -n 1)
[ -n "$pc" ] || fail "no dlshare.pc installed"
libdir=$(dirname "$(dirname "$pc")")
for f in bin/dlshared bin/dlsharectl include/dlshare/dlshare.h \
	 lib/systemd/system/dlshared.service lib/systemd/system/dlshared.socket \
	 lib/sysusers.d/dlshare.conf lib/tmpfiles.d/dlshare.conf \
	 share/man/man8/dlshared.8 share/man/man5/dlshared.conf.5 \
	 share/man/man1/dlsharectl.1 share/doc/dlshare/examples/dlshared.conf; do
	[ -e "$prefix/$f" ] || fail "$f not installed"
done
for f in libdlshare.so libdlshare.so.0 cmake/dlshare/dlshareConfig.cmake; do
	[ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
# Installed programs run from the prefix alone: no LD_LIBRARY_PATH.
env -u LD_LIBRARY_PATH "$prefix/bin/dlsharectl" --help >"$tmp/help" 2>&1 ||
	{ cat "$tmp/help"; fail "installed dlsharectl --help (without LD_LIBRARY_PATH)"; }
if command -v readelf >/dev/null 2>&1; then
	case $(readelf -d "$prefix/bin/dlsharectl") in
	*'[$ORIGIN/'*) ;;
	*) readelf -d "$prefix/bin/dlsharectl"
	   fail "dlsharectl has no \$ORIGIN-relative RPATH" ;;
	esac
fi
# Nothing of the build's test doubles or generators goes out.
if find "$prefix" -name '*fakecuda*' -o -name 'dlshared_manopts' | grep -q .; then
	fail "test or build-only files installed"
fi
# The example configuration file is what the daemon reads.
"$prefix/bin/dlshared" --check-config --config \
	"$prefix/share/doc/dlshare/examples/dlshared.conf" >/dev/null ||
	fail "the installed example dlshared.conf does not check"
# Where the build found UCX: the relay's unit, example configuration (at
# etc/dlshare under a prefix other than /usr) and man page.
relay_pages=
if [ -f "$build/systemd/dlshare-relay.service" ]; then
	for f in lib/systemd/system/dlshare-relay.service etc/dlshare/relay.conf \
		 share/doc/dlshare/examples/relay.conf share/man/man1/dlshare-relay.1; do
		[ -e "$prefix/$f" ] || fail "$f not installed (the build has UCX)"
	done
	relay_pages=dlshare-relay
fi
if command -v man >/dev/null 2>&1; then
	for p in dlshared dlshared.conf dlsharectl $relay_pages; do
		man -M "$prefix/share/man" -w "$p" >/dev/null 2>&1 ||
			fail "man cannot find $p in $prefix/share/man"
	done
fi
echo "ok"

echo "== pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --variable=prefix dlshare)" = "$prefix" ] ||
	fail "dlshare.pc names prefix $(pkg-config --variable=prefix dlshare)"
# shellcheck disable=SC2046,SC2086
$cc $cflags -o "$tmp/consumer-pc" "$src/tests/service/consumer/consumer.c" \
	$(pkg-config --cflags --libs dlshare) -Wl,-rpath,"$libdir" ||
	fail "building the consumer with pkg-config"
echo "ok"

echo "== find_package(dlshare)"
cmake -S "$src/tests/service/consumer" -B "$tmp/cmake" \
	-DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="$cflags" \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo >"$tmp/cmake.log" 2>&1 &&
cmake --build "$tmp/cmake" >>"$tmp/cmake.log" 2>&1 ||
	{ cat "$tmp/cmake.log"; fail "building the consumer with find_package"; }
echo "ok"

echo "== run both against the installed daemon"
sock=$tmp/dlshared.sock
"$prefix/bin/dlshared" --config /dev/null --socket "$sock" 2>"$tmp/daemon.log" &
daemon=$!
i=0
while [ ! -S "$sock" ]; do
	i=$((i + 1))
	[ $i -lt 500 ] || { cat "$tmp/daemon.log"; fail "the daemon did not start"; }
	kill -0 "$daemon" 2>/dev/null || { cat "$tmp/daemon.log"; fail "the daemon died"; }
	sleep 0.02
done
for c in "$tmp/consumer-pc" "$tmp/cmake/consumer"; do
	# The installed library, not the build tree's.
	ldd "$c" | grep -q "$libdir/libdlshare.so.0" ||
		{ ldd "$c"; fail "$c does not load $libdir/libdlshare.so.0"; }
	"$c" "$sock" "install/$(basename "$c")" || fail "$c"
done
# The installed dlsharectl finds the installed library by its relative
# RPATH ($ORIGIN/../lib), with no LD_LIBRARY_PATH.
loaded=$(env -u LD_LIBRARY_PATH ldd "$prefix/bin/dlsharectl" |
	sed -n 's/^[[:space:]]*libdlshare\.so\.0 => \(.*\) (0x.*/\1/p')
[ -n "$loaded" ] && [ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libdlshare.so.0")" ] ||
	{ ldd "$prefix/bin/dlsharectl"; fail "installed dlsharectl does not load $libdir/libdlshare.so.0"; }
env -u LD_LIBRARY_PATH "$prefix/bin/dlsharectl" --socket "$sock" ls >"$tmp/ls" ||
	fail "installed dlsharectl"
grep -q "install/consumer-pc" "$tmp/ls" && grep -q "install/consumer " "$tmp/ls" ||
	{ cat "$tmp/ls"; fail "dlsharectl ls does not show what the consumers stored"; }
kill -TERM "$daemon"
st=0
wait "$daemon" || st=$?
daemon=
[ $st -eq 0 ] || { cat "$tmp/daemon.log"; fail "the daemon exited with $st"; }
[ ! -e "$sock" ] || fail "the daemon left its own socket file behind"
echo "ok"
