#!/bin/sh
# test_man.sh MAN_DIR: the man pages render without a warning (groff -ww)
# and man(1) reads them (dlshare-relay.1 too where it was built). Exits 77 (skipped) when groff is missing.
set -eu
dir=$1

if ! command -v groff >/dev/null 2>&1; then
	echo "SKIPPED: groff not found (Debian package: groff-base)"
	exit 77
fi
status=0
pages="dlshared.8 dlshared.conf.5 dlsharectl.1"
# dlshare-relay.1 is built where UCX is (man/CMakeLists.txt).
[ -e "$dir/dlshare-relay.1" ] && pages="$pages dlshare-relay.1"
for page in $pages; do
	[ -s "$dir/$page" ] || { echo "FAIL: $dir/$page missing"; exit 1; }
	out=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$dir/$page" 2>&1)
	if [ -n "$out" ]; then
		echo "FAIL: $page: groff warns:"
		echo "$out"
		status=1
	fi
	if command -v man >/dev/null 2>&1; then
		out=$(MANWIDTH=80 LC_ALL=C.UTF-8 man -l "$dir/$page" 2>&1 >/dev/null)
		if [ -n "$out" ]; then
			echo "FAIL: $page: man -l says:"
			echo "$out"
			status=1
		fi
	fi
	echo "$page: ok"
done
exit $status
