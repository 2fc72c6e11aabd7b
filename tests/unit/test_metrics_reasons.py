"""The reasons the daemon gives for a refusal at a limit and for cutting a
peer off, each found in daemon/metrics.c's tables: a new reason that is not
there would count as "other" in dlshare_limit_hits_total or
dlshare_peers_cut_off_total without anyone noticing.

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
    limits = table(metrics, "limit_whys")
    cuts = table(metrics, "cut_whys")
    problems = []
    seen_limit = seen_cut = 0
    for path in sorted(glob.glob(os.path.join(root, "daemon", "*.c"))):
        if path.endswith("metrics.c"):
            continue
        src = open(path).read()
        where = os.path.relpath(path, root)
        # Refusals at a limit: refuse(why, "...", -EDQUOT|-ENOSPC), a
        # reply_err_why(..., -EDQUOT, "..."), *why = "..." for a quota.
        for m in re.finditer(r'refuse\(why,\s*((?:"(?:[^"\\]|\\.)*"\s*)+),'
                             r'\s*-E(DQUOT|NOSPC)\)', src):
            why = strings(m.group(1))
            seen_limit += 1
            if not any(why.startswith(w) for w, _ in limits):
                problems.append(f"{where}: limit reason {why!r}")
        for m in re.finditer(r'reply_err_why\([^;]*?-E(?:DQUOT|NOSPC),\s*'
                             r'((?:"(?:[^"\\]|\\.)*"\s*)+)', src):
            why = strings(m.group(1))
            seen_limit += 1
            if not any(why.startswith(w) for w, _ in limits):
                problems.append(f"{where}: limit reason {why!r}")
        for m in re.finditer(r'\*why = ("(?:[^"\\]|\\.)*");\s*return -EDQUOT',
                             src):
            why = strings(m.group(1))
            seen_limit += 1
            if not any(why.startswith(w) for w, _ in limits):
                problems.append(f"{where}: limit reason {why!r}")
        # Reasons a conn fails: conn_fail(c, ...) and conn_protocol_error.
        for m in re.finditer(r'(?<!void )conn_(?:fail|protocol_error)\([^;]*?\);', src,
                             re.S):
            for why in re.findall(r'"((?:[^"\\]|\\.)*)"', m.group(0)):
                seen_cut += 1
                if not any(why == w or (c == "METRICS_CUT_SLOW_READER" and
                                        why.startswith(w)) for w, c in cuts):
                    problems.append(f"{where}: conn failure reason {why!r}")
    if seen_limit < 15 or seen_cut < 15:
        problems.append(f"found only {seen_limit} limit and {seen_cut} "
                        "failure reasons: the patterns above went stale")
    for p in problems:
        print("FAIL:", p, "(add it to daemon/metrics.c)")
    print(f"{seen_limit} limit reasons, {seen_cut} failure reasons checked")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
