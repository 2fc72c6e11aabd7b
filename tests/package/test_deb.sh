#!/bin/sh
# test_deb.sh SOURCE_DIR
#
# The Debian package as an operator gets it (cmake/package.cmake): builds
# the tree for /usr (what the .deb needs), runs `cpack -G DEB`, checks the
# package's control data and contents, installs it with dpkg into a scratch
# root (dpkg --root, maintainer scripts run chrootless with DPKG_ROOT set:
# nothing on this machine is touched, nothing is started), checks what
# postinst did there (the user, the enabled socket), runs the installed
# dlshared and dlsharectl stats against it, and purges it again.
# Skips (77) without dpkg-deb or cpack, or when not root (dpkg --root).
set -eu

src=$1
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

[ -n "${DLSHARE_TEST_PACKAGE_SKIP:-}" ] && skip "$DLSHARE_TEST_PACKAGE_SKIP"

for p in dpkg dpkg-deb dpkg-shlibdeps cpack cmake; do
	command -v $p >/dev/null 2>&1 ||
		skip "no $p here (Debian: dpkg-dev, cmake; scripts/dev deps installs them)"
done
[ "$(id -u)" -eq 0 ] ||
	skip "needs root: dpkg --root installs files owned by root:root"

tmp=$(mktemp -d /tmp/dlshare-deb-XXXXXX)
daemon=
cleanup() {
	if [ -n "$daemon" ]; then
		kill -KILL "$daemon" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "== build for /usr, cpack -G DEB"
# What the package holds, nothing more (tests, benchmarks and the Python
# binding are not in it).
cmake -S "$src" -B "$tmp/build" -DCMAKE_INSTALL_PREFIX=/usr \
	-DCMAKE_BUILD_TYPE=RelWithDebInfo \
	-DDLSHARE_TESTS=OFF -DDLSHARE_BENCH=OFF -DDLSHARE_PYTHON=OFF \
	>"$tmp/build.log" 2>&1 &&
	cmake --build "$tmp/build" -j "${DLSHARE_TEST_JOBS:-2}" >>"$tmp/build.log" 2>&1 ||
	{ tail -n 40 "$tmp/build.log"; fail "building for /usr"; }
(cd "$tmp/build" && cpack -G DEB) >"$tmp/cpack.log" 2>&1 ||
	{ cat "$tmp/cpack.log"; fail "cpack -G DEB"; }
deb=$(ls "$tmp"/build/dlshare_*.deb)
echo "$deb"
echo "ok"

echo "== dpkg-deb --info"
dpkg-deb --info "$deb" >"$tmp/info"
for want in "Package: dlshare" "Architecture: $(dpkg --print-architecture)" \
	    "Depends: .*libuv1" "Depends: .*libprotobuf-c1" "Depends: .*libinih1" \
	    " postinst " " prerm " " postrm " " triggers "; do
	grep -q -- "$want" "$tmp/info" || { cat "$tmp/info"; fail "no '$want' in --info"; }
done
echo "ok"

echo "== dpkg-deb --contents"
dpkg-deb --contents "$deb" | awk '{print $6}' | sed 's,^\./,/,' >"$tmp/contents"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
for f in /usr/bin/dlshared /usr/bin/dlsharectl /usr/include/dlshare/dlshare.h \
	 /usr/lib/$multiarch/libdlshare.so.0 /usr/lib/$multiarch/libdlshare.so \
	 /usr/lib/$multiarch/pkgconfig/dlshare.pc \
	 /usr/lib/$multiarch/cmake/dlshare/dlshareConfig.cmake \
	 /usr/lib/sysusers.d/dlshare.conf /usr/lib/tmpfiles.d/dlshare.conf \
	 /usr/share/man/man8/dlshared.8 /usr/share/man/man5/dlshared.conf.5 \
	 /usr/share/man/man1/dlsharectl.1; do
	grep -qx -- "$f" "$tmp/contents" || { cat "$tmp/contents"; fail "$f not in the package"; }
done
grep -q '/systemd/system/dlshared.service$' "$tmp/contents" &&
	grep -q '/systemd/system/dlshared.socket$' "$tmp/contents" ||
	{ cat "$tmp/contents"; fail "no systemd units in the package"; }
if grep -E 'fakecuda|python|/bench|/tests?/' "$tmp/contents"; then
	fail "test, benchmark or Python files in the package"
fi
echo "ok"

# With UCX (pkg-config ucx) the relay's files come too, relay.conf as a
# conffile; without it none of them.
echo "== dlshare-relay's files"
relay_files="/lib/systemd/system/dlshare-relay.service /etc/dlshare/relay.conf
	/usr/share/man/man1/dlshare-relay.1"
if pkg-config --exists ucx; then
	for f in $relay_files; do
		grep -q -- "$f\$" "$tmp/contents" ||
			{ cat "$tmp/contents"; fail "$f not in the package (UCX is here)"; }
	done
	dpkg-deb --info "$deb" conffiles | grep -qx /etc/dlshare/relay.conf ||
		fail "/etc/dlshare/relay.conf is not a conffile"
	echo "ok"
else
	for f in $relay_files; do
		if grep -q -- "$f\$" "$tmp/contents"; then
			fail "$f in the package of a build without UCX"
		fi
	done
	echo "ok (no UCX here: none of them)"
fi

echo "== postinst on this machine, its commands stubbed"
# Without DPKG_ROOT the scripts act on / : every command that would change
# something here is a stub that logs its arguments. The socket is enabled
# always, started only where systemd runs this machine (/run/systemd/system).
dpkg-deb -e "$deb" "$tmp/control"
mkdir "$tmp/stubs"
for c in systemd-sysusers systemd-tmpfiles systemctl deb-systemd-helper \
	 deb-systemd-invoke groupadd useradd; do
	printf '#!/bin/sh\necho "%s $*" >>"%s"\n' "$c" "$tmp/calls" >"$tmp/stubs/$c"
	chmod +x "$tmp/stubs/$c"
done
for args in "configure" "configure 0.0.1"; do
	: >"$tmp/calls"
	# shellcheck disable=SC2086
	env -u DPKG_ROOT PATH="$tmp/stubs:$PATH" "$tmp/control/postinst" $args ||
		fail "postinst $args"
	grep -qx "systemd-sysusers --root=/ dlshare.conf" "$tmp/calls" &&
		grep -qx "deb-systemd-helper enable dlshared.socket" "$tmp/calls" ||
		{ cat "$tmp/calls"; fail "postinst $args: no user, or the socket not enabled"; }
	if [ -d /run/systemd/system ]; then
		grep -q "start dlshared.socket" "$tmp/calls" ||
			{ cat "$tmp/calls"; fail "postinst $args did not start the socket under systemd"; }
	elif grep -q "start\|restart\|daemon-reload" "$tmp/calls"; then
		cat "$tmp/calls"; fail "postinst $args started something with no systemd running"
	fi
done
: >"$tmp/calls"
env -u DPKG_ROOT PATH="$tmp/stubs:$PATH" "$tmp/control/prerm" remove &&
	env -u DPKG_ROOT PATH="$tmp/stubs:$PATH" "$tmp/control/postrm" purge ||
	fail "prerm remove, postrm purge"
grep -qx "deb-systemd-helper purge dlshared.socket dlshared.service" "$tmp/calls" ||
	{ cat "$tmp/calls"; fail "postrm purge left the units' enablement"; }
echo "ok"

echo "== dpkg --root: install into a scratch root"
root=$tmp/root
mkdir -p "$root/etc" "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" \
	"$root/var/lib/dpkg/triggers"
touch "$root/var/lib/dpkg/status" "$root/var/lib/dpkg/available"
# The scratch root has none of the libraries the package depends on: this
# machine's are used to run it (--force-depends).
dpkg_root() {
	dpkg --root="$root" --force-script-chrootless --force-depends \
		--log=/dev/null "$@"
}
passwd_before=$(cat /etc/passwd)
dpkg_root -i "$deb" >"$tmp/dpkg.log" 2>&1 || { cat "$tmp/dpkg.log"; fail "dpkg -i"; }
dpkg_root -s dlshare | grep -q "^Status: install ok installed" ||
	{ cat "$tmp/dpkg.log"; fail "dlshare is not installed in the scratch root"; }
grep -q "^dlshare:" "$root/etc/passwd" && grep -q "^dlshare:" "$root/etc/group" ||
	{ cat "$tmp/dpkg.log"; fail "postinst made no user dlshare in the scratch root"; }
[ "$(cat /etc/passwd)" = "$passwd_before" ] ||
	fail "postinst touched this machine's /etc/passwd"
link=$root/etc/systemd/system/sockets.target.wants/dlshared.socket
[ -L "$link" ] || { cat "$tmp/dpkg.log"; fail "postinst did not enable dlshared.socket"; }
unit=$(find "$root" -path '*/systemd/system/dlshared.service' -type f)
grep -qx "ExecStart=/usr/bin/dlshared" "$unit" ||
	{ grep ExecStart "$unit"; fail "the packaged unit does not start /usr/bin/dlshared"; }
echo "ok"

echo "== the installed dlshared and dlsharectl"
libdir=$root/usr/lib/$multiarch
sock=$tmp/dlshared.sock
# dlshared links no libdlshare; dlsharectl finds the scratch root's by its
# $ORIGIN-relative RPATH, with no LD_LIBRARY_PATH.
"$root/usr/bin/dlshared" --config /dev/null --socket "$sock" 2>"$tmp/daemon.log" &
daemon=$!
# Serving once it answers: the socket file comes before listen().
i=0
until env -u LD_LIBRARY_PATH "$root/usr/bin/dlsharectl" --socket "$sock" stats >/dev/null 2>&1; do
	i=$((i + 1))
	[ $i -lt 500 ] || { cat "$tmp/daemon.log"; fail "the installed daemon did not start"; }
	kill -0 "$daemon" 2>/dev/null || { cat "$tmp/daemon.log"; fail "the installed daemon died"; }
	sleep 0.02
done
loaded=$(env -u LD_LIBRARY_PATH ldd "$root/usr/bin/dlsharectl" |
	sed -n 's/^[[:space:]]*libdlshare\.so\.0 => \(.*\) (0x.*/\1/p')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$libdir/libdlshare.so.0")" ] ||
	{ ldd "$root/usr/bin/dlsharectl"; fail "the installed dlsharectl does not load $libdir/libdlshare.so.0"; }
head -c 4096 /dev/urandom >"$tmp/in"
env -u LD_LIBRARY_PATH "$root/usr/bin/dlsharectl" --socket "$sock" \
	put deb/check "$tmp/in" --dtype uint8 --shape 4096 >/dev/null ||
	fail "installed dlsharectl put"
env -u LD_LIBRARY_PATH "$root/usr/bin/dlsharectl" --socket "$sock" cat deb/check >"$tmp/out"
cmp "$tmp/in" "$tmp/out" || fail "installed dlsharectl read other bytes"
env -u LD_LIBRARY_PATH "$root/usr/bin/dlsharectl" --socket "$sock" stats >"$tmp/stats" ||
	fail "installed dlsharectl stats"
cat "$tmp/stats"
grep -Eq "^names[[:space:]]+1$" "$tmp/stats" || fail "stats does not count the name"
kill -TERM "$daemon"
st=0
wait "$daemon" || st=$?
daemon=
[ $st -eq 0 ] || { cat "$tmp/daemon.log"; fail "the installed daemon exited with $st"; }
echo "ok"

echo "== dpkg --purge"
dpkg_root --purge dlshare >"$tmp/purge.log" 2>&1 || { cat "$tmp/purge.log"; fail "dpkg --purge"; }
[ ! -e "$link" ] && [ ! -L "$link" ] || fail "purge left dlshared.socket enabled"
left=$(find "$root/usr" "$root/lib" -type f 2>/dev/null || true)
[ -z "$left" ] || { echo "$left"; fail "purge left files"; }
echo "ok"
