"""`dlsharectl metrics` (issue 17): a daemon driven into known states
(names, leases, a refused request, a limit hit, peers cut off) and the
values its metrics then say, read through a strict parser of the Prometheus
text exposition format (version 0.0.4) written here; and --output's atomic
file, also when the daemon is down."""

import math
import os
import re
import socket
import stat
import subprocess
import tempfile
import time
import unittest

import dlshare

from harness import DaemonTest, timeout, wait_until

DLSHARECTL = os.environ.get("DLSHARECTL", "")

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)( -?\d+)?\Z")


class ExpositionError(ValueError):
    pass


def _labels(text, where):
    """{a="x",b="y\\"z"} -> (("a", "x"), ("b", 'y"z')), strictly."""
    out, i = [], 1
    body = text[1:-1]
    i = 0
    while i < len(body):
        eq = body.find("=", i)
        if eq < 0:
            raise ExpositionError(f"{where}: label without '='")
        name = body[i:eq]
        if not _LABEL.match(name) or name.startswith("__"):
            raise ExpositionError(f"{where}: bad label name {name!r}")
        if body[eq + 1:eq + 2] != '"':
            raise ExpositionError(f"{where}: label value not quoted")
        j, val = eq + 2, []
        while True:
            if j >= len(body):
                raise ExpositionError(f"{where}: unterminated label value")
            ch = body[j]
            if ch == "\\":
                nxt = body[j + 1:j + 2]
                if nxt not in ("\\", '"', "n"):
                    raise ExpositionError(f"{where}: bad escape \\{nxt}")
                val.append("\n" if nxt == "n" else nxt)
                j += 2
            elif ch == '"':
                break
            elif ch == "\n":
                raise ExpositionError(f"{where}: raw newline in a value")
            else:
                val.append(ch)
                j += 1
        out.append((name, "".join(val)))
        j += 1
        if j < len(body):
            if body[j] != ",":
                raise ExpositionError(f"{where}: expected ',' after a label")
            j += 1
        i = j
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        raise ExpositionError(f"{where}: a label twice")
    return tuple(out)


def parse(text, prefix="dlshare_"):
    """Parses exposition text; returns {family: {"type", "help", "samples":
    {labels-tuple: value}}}. Raises ExpositionError on anything that is
    not strictly valid: a sample outside a declared family, HELP or TYPE
    twice or after its samples, a family split in two, bad names or
    labels or escapes, a counter not named *_total (or a gauge that is),
    a duplicate series, a value that does not parse, a missing final
    newline."""
    if text and not text.endswith("\n"):
        raise ExpositionError("the text does not end with a newline")
    fams, current, done = {}, None, set()
    for n, line in enumerate(text.split("\n")[:-1], 1):
        where = f"line {n}"
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not _NAME.match(name) or not name.startswith(prefix):
                    raise ExpositionError(f"{where}: bad family {name!r}")
                if name in done:
                    raise ExpositionError(f"{where}: {name} split in two")
                if current and current != name:
                    done.add(current)
                current = name
                f = fams.setdefault(name, {"type": None, "help": None,
                                           "samples": {}})
                if f["samples"]:
                    raise ExpositionError(f"{where}: {parts[1]} after samples")
                key = parts[1].lower()
                if f[key] is not None:
                    raise ExpositionError(f"{where}: {parts[1]} twice")
                value = parts[3] if len(parts) > 3 else ""
                if key == "type":
                    if value not in ("counter", "gauge"):
                        raise ExpositionError(f"{where}: type {value!r}")
                    if (value == "counter") != name.endswith("_total"):
                        raise ExpositionError(
                            f"{where}: {name}: counters, and only they, "
                            "end in _total")
                else:
                    if re.search(r"\\[^\\n]", value.replace("\\\\", "")):
                        raise ExpositionError(f"{where}: bad escape in HELP")
                f[key] = value
            continue  # other comments are allowed
        if not line.strip():
            raise ExpositionError(f"{where}: empty line")
        m = _SAMPLE.match(line)
        if not m:
            raise ExpositionError(f"{where}: not a sample: {line!r}")
        name, labels, value = m.group(1), m.group(2), m.group(3)
        if name != current or name not in fams or fams[name]["type"] is None:
            raise ExpositionError(f"{where}: {name} has no TYPE before it "
                                  "(every sample belongs to a family)")
        key = _labels(labels, where) if labels else ()
        key = tuple(sorted(key))
        try:
            v = float(value)
        except ValueError:
            raise ExpositionError(f"{where}: value {value!r}") from None
        if value.lower() in ("nan", "inf", "-inf", "+inf") and \
                value not in ("NaN", "+Inf", "-Inf"):
            raise ExpositionError(f"{where}: value {value!r}")
        if fams[name]["type"] == "counter" and (v < 0 or math.isnan(v)):
            raise ExpositionError(f"{where}: counter {name} is {value}")
        if key in fams[name]["samples"]:
            raise ExpositionError(f"{where}: duplicate series {name}{key}")
        fams[name]["samples"][key] = v
    for name, f in fams.items():
        if f["type"] is None or f["help"] is None:
            raise ExpositionError(f"{name}: no TYPE or no HELP")
    return fams


def value(fams, name, **labels):
    """The value of one series; None when it is absent."""
    return fams[name]["samples"].get(tuple(sorted(labels.items())))


class ParserTest(unittest.TestCase):
    """The parser refuses what it must (else it proves nothing)."""

    GOOD = ('# HELP dlshare_x_total X.\n# TYPE dlshare_x_total counter\n'
            'dlshare_x_total{a="q\\"\\\\\\n",b="2"} 3\n'
            '# HELP dlshare_g G.\n# TYPE dlshare_g gauge\ndlshare_g 1.5e3\n')

    def test_good(self):
        f = parse(self.GOOD)
        self.assertEqual(value(f, "dlshare_x_total", a='q"\\\n', b="2"), 3)
        self.assertEqual(value(f, "dlshare_g"), 1500)

    def test_refusals(self):
        bad = {
            "undeclared": "dlshare_y 1\n",
            "counter name": "# HELP dlshare_c C\n# TYPE dlshare_c counter\n",
            "gauge _total": "# HELP dlshare_c_total C\n"
                            "# TYPE dlshare_c_total gauge\n",
            "duplicate": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                         "dlshare_g{a=\"1\"} 1\ndlshare_g{a=\"1\"} 2\n",
            "escape": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                      "dlshare_g{a=\"\\t\"} 1\n",
            "label": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                     "dlshare_g{1a=\"x\"} 1\n",
            "value": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                     "dlshare_g abc\n",
            "newline": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                       "dlshare_g 1",
            "split": "# HELP dlshare_g G\n# TYPE dlshare_g gauge\n"
                     "dlshare_g 1\n# HELP dlshare_h H\n# TYPE dlshare_h "
                     "gauge\ndlshare_h 1\ndlshare_g{a=\"b\"} 1\n",
            "prefix": "# HELP other_g G\n# TYPE other_g gauge\nother_g 1\n",
            "no help": "# TYPE dlshare_g gauge\ndlshare_g 1\n",
            "negative counter": "# HELP dlshare_c_total C\n"
                                "# TYPE dlshare_c_total counter\n"
                                "dlshare_c_total -1\n",
        }
        for why, text in bad.items():
            with self.subTest(why):
                with self.assertRaises(ExpositionError):
                    parse(text)


def ctl(sock, *args, check=True):
    if not DLSHARECTL or not os.access(DLSHARECTL, os.X_OK):
        raise unittest.SkipTest(f"no dlsharectl (DLSHARECTL={DLSHARECTL!r})")
    r = subprocess.run([DLSHARECTL, "--socket", sock, *args],
                       capture_output=True, text=True,
                       timeout=timeout(30))
    if check and r.returncode:
        raise AssertionError(f"dlsharectl {' '.join(args)}: {r.returncode}"
                             f"\n{r.stderr}")
    return r


def tensor(n):
    return dlshare.empty((n,), "float32")


class MetricsTest(DaemonTest):
    # A small names quota to cross, and a Hello timeout short enough to
    # wait for (the sweep runs once a second).
    daemon_args = ("--uid-names", "4", "--hello-timeout", "100")

    def metrics(self):
        return parse(ctl(self.daemon.socket, "metrics").stdout)

    def test_known_states(self):
        c = self.client
        for i in range(4):
            c.publish(self.name(f"n{i}"), tensor(4 + i))
        held = [c.get(self.name("n0")), c.get(self.name("n1"))]
        # A refused request: no such name.
        with self.assertRaises(dlshare.NotFound):
            c.get(self.name("missing"))
        # A limit hit: the fifth name of this uid.
        with self.assertRaises(dlshare.LimitExceeded):
            c.publish(self.name("n4"), tensor(1))
        # A peer cut off for a frame that does not decode, and one that
        # never says Hello.
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.connect(self.daemon.socket)
            s.send(b"\xff\xff\xff\xff")
            s.settimeout(timeout(5))
            s.recv(4096)  # the Error, then the hang-up
        silent = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        silent.connect(self.daemon.socket)
        try:
            got = wait_until(lambda: value(
                self.metrics(), "dlshare_peers_cut_off_total",
                reason="hello-timeout") == 1, seconds=10, step=0.2)
            self.assertTrue(got, "the silent peer was not cut off")
        finally:
            silent.close()
        f = self.metrics()
        uid = str(os.getuid())
        want = {
            ("dlshare_up", ()): 1,
            ("dlshare_names", ()): 4,
            ("dlshare_versions", ()): 4,
            ("dlshare_leases", ()): 2,
            ("dlshare_buffers", ()): 4,
            ("dlshare_buffer_bytes", ()): 4 * (4 + 5 + 6 + 7),
            ("dlshare_kind_buffers", (("kind", "host"),)): 4,
            ("dlshare_kind_buffer_bytes", (("kind", "host"),)): 88,
            ("dlshare_kind_buffers", (("kind", "cuda-vmm"),)): 0,
            ("dlshare_parked_gets", ()): 0,
            ("dlshare_waiting_producers", ()): 0,
            ("dlshare_errors_total", (("code", "ENOENT"), ("type", "get"))): 1,
            ("dlshare_errors_total",
             (("code", "ELIMIT"), ("type", "publish"))): 1,
            ("dlshare_limit_hits_total", (("limit", "uid-names"),)): 1,
            ("dlshare_limit_hits_total", (("limit", "other"),)): 0,
            ("dlshare_peers_cut_off_total", (("reason", "bad-frame"),)): 1,
            ("dlshare_peers_cut_off_total",
             (("reason", "hello-timeout"),)): 1,
            ("dlshare_uid_names", (("uid", uid),)): 4,
            ("dlshare_uid_names_limit", ()): 4,
            ("dlshare_uid_leases", (("uid", uid),)): 2,
            ("dlshare_uid_quota_usage_ratio",
             (("quota", "uid-names"), ("uid", uid))): 1,
        }
        for (name, labels), v in want.items():
            with self.subTest(name=name, labels=labels):
                self.assertIn(name, f)
                self.assertEqual(f[name]["samples"].get(labels), v)
        # Requests by type: 5 publishes, 3 gets so far at least, and the
        # Stats of each `dlsharectl metrics`.
        self.assertEqual(value(f, "dlshare_requests_total", type="publish"), 5)
        self.assertGreaterEqual(value(f, "dlshare_requests_total", type="get"), 3)
        self.assertGreaterEqual(value(f, "dlshare_requests_total", type="stats"), 1)
        # Every error sent is in a row; nothing fell into "other".
        self.assertIsNone(value(f, "dlshare_errors_total", type="other",
                                code="other"))
        for h in held:
            h.release()
        self.assertLeasesBecome(0)

    def test_from_python(self):
        # Client.metrics(): the same text, through the binding.
        f = parse(self.client.metrics())
        self.assertEqual(value(f, "dlshare_up"), 1)
        self.assertIn("dlshare_uid_quota_usage_ratio", f)

    def test_output_file(self):
        d = tempfile.mkdtemp(prefix="dlshare-metrics-")
        path = os.path.join(d, "dlshare.prom")
        try:
            ctl(self.daemon.socket, "metrics", "--output", path)
            self.assertEqual(os.listdir(d), ["dlshare.prom"])  # no temp left
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o644)
            with open(path) as fp:
                f = parse(fp.read())
            self.assertEqual(value(f, "dlshare_up"), 1)
            # The daemon gone: the file says so, and the command fails.
            r = ctl(os.path.join(d, "nothing.sock"), "metrics", "--output",
                    path, check=False)
            self.assertEqual(r.returncode, 1, r.stderr)
            with open(path) as fp:
                f = parse(fp.read())
            self.assertEqual(list(f), ["dlshare_up"])
            self.assertEqual(value(f, "dlshare_up"), 0)
            self.assertEqual(os.listdir(d), ["dlshare.prom"])
            # A directory it may not write: an error naming the file.
            r = ctl(self.daemon.socket, "metrics", "--output",
                    os.path.join(d, "no", "such", "dir.prom"), check=False)
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("dir.prom", r.stderr)
        finally:
            for n in os.listdir(d):
                os.unlink(os.path.join(d, n))
            os.rmdir(d)


class SmallPacketTest(DaemonTest):
    # The smallest packet the daemon allows: the Stats reply with every
    # counter row must still fit (the daemon sheds usage, uid and error
    # rows first), or the monitor would be cut off.
    daemon_args = ("--max-packet", "4096")

    def test_fits(self):
        for i in range(3):
            with self.assertRaises(dlshare.NotFound):
                self.client.get(self.name(f"missing{i}"))
        f = parse(ctl(self.daemon.socket, "metrics").stdout)
        self.assertEqual(value(f, "dlshare_up"), 1)
        self.assertEqual(value(f, "dlshare_errors_total", type="get",
                               code="ENOENT"), 3)
        self.assertEqual(value(f, "dlshare_peers_cut_off_total",
                               reason="daemon-error"), 0)


if __name__ == "__main__":
    unittest.main()
