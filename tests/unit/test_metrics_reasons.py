"""The reasons the daemon gives for cutting a peer off, each found in
daemon/metrics.c's table: a new reason that is not there would count as
"other" in dlshare_peers_cut_off_total without anyone noticing. (Refusals
at a limit name their limit by enum where they refuse: struct refusal,
peer_limit_hit; tests/python/test_metrics.py crosses each one.)

  test_metrics_reasons.py SOURCE_DIR
"""
import glob
import os
import re
import sys


def strings(text):
    """The C string literals of text, adjacent ones joined."""
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', text))


def table(src, name):
    body = re.search(r"\b%s\[\] = \{(.*?)\n\};" % name, src, re.S).group(1)
    return [(m.group(1), m.group(2)) for m in
            re.finditer(r'\{\s*"((?:[^"\\]|\\.)*)",\s*([-\w]+)\s*\}', body)]


def main(root):
    metrics = open(os.path.join(root, "daemon", "metrics.c")).read()
    cuts = table(metrics, "cut_whys")
    problems = []
    seen_cut = 0
    for path in sorted(glob.glob(os.path.join(root, "daemon", "*.c"))):
        if path.endswith("metrics.c"):
            continue
        src = open(path).read()
        where = os.path.relpath(path, root)
        # Reasons a conn fails: conn_fail(c, ...) and conn_protocol_error.
        for m in re.finditer(r'(?<!void )conn_(?:fail|protocol_error)\([^;]*?\);', src,
                             re.S):
            for why in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(0)):
                seen_cut += 1
                if not any(why == w or (c == "METRICS_CUT_SLOW_READER" and
                                        why.startswith(w)) for w, c in cuts):
                    problems.append(f"{where}: conn failure reason {why!r}")
    if seen_cut < 15:
        problems.append(f"found only {seen_cut} failure reasons: the "
                        "pattern above went stale")
    for p in problems:
        print("FAIL:", p, "(add it to daemon/metrics.c)")
    print(f"{seen_cut} failure reasons checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
