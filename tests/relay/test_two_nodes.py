"""README.md's "Across machines" walkthrough, run as written on two nodes.

The test makes the two nodes on this machine: two network namespaces joined
by a veth pair, A at 10.0.0.1 and B at 10.0.0.2 as the README says, and for
every command a mount namespace where the node's own directory is mounted
on /run/dlshare (so each node has its own daemon at the default system
socket, /run/dlshare/dlshared.sock) and a UTS namespace whose host name is
nodeA or nodeB. Each node's HOME is its own directory. The README's ```sh
blocks are taken from the Markdown at test time and run unedited, with the
build tree's programs first on PATH instead of step 1's package, and
UCX_TLS=tcp UCX_NET_DEVICES=eth1 in the environment (the README's
example): the two nodes share a kernel, and UCX, which tells machines
apart by boot id, would otherwise take them for one and use shared memory
or loopback, which does not reach the other namespace. Step 2's
`scp -p` to B is done by the test as a copy that keeps the mode.

What the README says the programs print (its unlabelled ``` blocks) is
checked line by line against what they printed.

Root only (network namespaces); otherwise it reads "Skipped" (77), saying
why, as does a build without dlshare-relay.

    test_two_nodes.py DLSHARED DLSHARECTL DLSHARE_RELAY
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SKIPPED = 77
SCALE = float(os.environ.get("DLSHARE_TEST_TIMEOUT_SCALE", "1") or 1)
PROGRAMS = {}
ADDR = {"A": "10.0.0.1", "B": "10.0.0.2"}


def section(heading):
    with open(os.path.join(ROOT, "README.md")) as f:
        text = "\n" + f.read()
    start = text.index("\n" + heading + "\n")
    end = re.search(r"\n## ", text[start + 1:])
    return text[start:start + 1 + end.start()] if end else text[start:]


def fenced(text, lang):
    """The fenced blocks of text whose info string is lang ("" for none),
    dedented by their fence's indent."""
    out = []
    for ind, info, body in re.findall(r"^( *)```(\w*)\n(.*?)^\1```$", text,
                                      re.S | re.M):
        if info == lang:
            out.append("".join(l[len(ind):] if l.startswith(ind) else l
                               for l in body.splitlines(True)))
    return out


def which_block(blocks, needle):
    found = [b for b in blocks if needle in b]
    if len(found) != 1:
        raise AssertionError(f"README 'Across machines': {len(found)} sh "
                             f"blocks contain {needle!r}, expected one")
    return found[0]


def sh(*argv, check=True):
    r = subprocess.run(argv, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {r.returncode}: "
                             f"{r.stderr.strip()}")
    return r


def can_make_nodes():
    if os.geteuid() != 0:
        return "not root: network namespaces need CAP_SYS_ADMIN"
    if not shutil.which("ip") or not shutil.which("unshare"):
        return "no ip(8) or unshare(1) (Debian: iproute2, util-linux)"
    probe = f"dlsprobe{os.getpid()}"
    r = sh("ip", "netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"ip netns add failed: {r.stderr.strip()}"
    sh("ip", "netns", "del", probe, check=False)
    return None


class TwoNodes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="dlshare-nodes-")
        os.chmod(cls.tmp, 0o755)
        cls.bin = os.path.join(cls.tmp, "bin")
        os.mkdir(cls.bin)
        for name, path in PROGRAMS.items():
            os.symlink(path, os.path.join(cls.bin, name))
        cls.ns = {n: f"dls{n}{os.getpid()}" for n in "AB"}
        cls.procs = []
        cls.made_run = not os.path.isdir("/run/dlshare")
        if cls.made_run:
            os.makedirs("/run/dlshare")
        for n in "AB":
            os.makedirs(os.path.join(cls.tmp, n, "run"))
            os.makedirs(os.path.join(cls.tmp, n, "home"))
            sh("ip", "netns", "add", cls.ns[n])
        # The link is eth1 on both sides, created in the root namespace
        # under unique names and renamed as it moves into its node.
        va, vb = f"dlsa{os.getpid()}"[:15], f"dlsb{os.getpid()}"[:15]
        sh("ip", "link", "add", va, "type", "veth", "peer", "name", vb)
        for n, dev in (("A", va), ("B", vb)):
            sh("ip", "link", "set", dev, "netns", cls.ns[n], "name", "eth1")
        for n, dev in (("A", "eth1"), ("B", "eth1")):
            ex = ("ip", "netns", "exec", cls.ns[n])
            sh(*ex, "ip", "addr", "add", ADDR[n] + "/24", "dev", dev)
            sh(*ex, "ip", "link", "set", dev, "up")
            sh(*ex, "ip", "link", "set", "lo", "up")
        # Each node's daemon, at the default system socket of its node.
        for n in "AB":
            cls.spawn(n, "dlshared --socket /run/dlshare/dlshared.sock",
                      "dlshared.log")
        for n in "AB":
            cls.wait_for(lambda: os.path.exists(
                os.path.join(cls.tmp, n, "run", "dlshared.sock")),
                f"node {n}'s daemon's socket")

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in cls.procs:
            try:
                p.wait(timeout=10 * SCALE)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for n in "AB":
            sh("ip", "netns", "del", cls.ns[n], check=False)
        if cls.made_run:
            os.rmdir("/run/dlshare")
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def node_argv(cls, n, script):
        """argv that runs script with sh on node n: its network namespace,
        /run/dlshare and HOME its own, host name nodeN."""
        node = os.path.join(cls.tmp, n)
        inner = (f"mount --bind {node}/run /run/dlshare && "
                 f"hostname node{n} && cd ~ && exec sh -ec \"$0\"")
        return ["ip", "netns", "exec", cls.ns[n], "unshare", "--mount",
                "--uts", "--propagation", "private", "sh", "-c", inner,
                script]

    @classmethod
    def node_env(cls, n):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("DLSHARE_", "UCX_"))}
        env.update(HOME=os.path.join(cls.tmp, n, "home"),
                   PATH=cls.bin + ":" + os.environ.get("PATH", "/usr/bin:/bin"),
                   UCX_TLS="tcp", UCX_NET_DEVICES="eth1")
        return env

    @classmethod
    def spawn(cls, n, script, log):
        """Starts script on node n in the background, its output in log."""
        with open(os.path.join(cls.tmp, n, log), "w") as f:
            p = subprocess.Popen(cls.node_argv(n, script), stdout=f,
                                 stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL,
                                 env=cls.node_env(n), start_new_session=True)
        cls.procs.append(p)
        return p

    def run_on(self, n, script, seconds=60):
        r = subprocess.run(self.node_argv(n, script), capture_output=True,
                           text=True, env=self.node_env(n),
                           timeout=seconds * SCALE)
        if r.returncode != 0:
            self.fail(f"on node {n}: {script!r} exited {r.returncode}:\n"
                      f"{r.stdout}{r.stderr}\n{self.logs()}")
        return r.stdout

    @classmethod
    def wait_for(cls, pred, what, seconds=20):
        deadline = time.monotonic() + seconds * SCALE
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} within {seconds * SCALE} "
                                     f"s\n{cls.logs()}")
            time.sleep(0.05)

    @classmethod
    def log(cls, n, name):
        try:
            with open(os.path.join(cls.tmp, n, name)) as f:
                return f.read()
        except FileNotFoundError:
            return ""

    @classmethod
    def logs(cls):
        return "".join(f"--- node {n} {name}\n{cls.log(n, name)}"
                       for n in "AB"
                       for name in ("dlshared.log", "relay.log"))

    def expect_lines(self, expected, n, printed):
        """Each line of a README output block is a line of what node n's
        program printed; "..." stands for lines the README leaves out, a
        port number for the one the kernel chose."""
        for line in expected.splitlines():
            if not line.strip() or line.strip() == "...":
                continue
            pat = re.escape(line.strip())
            pat = re.sub(r"10\\.0\\.0\\.2:\d+", r"10\\.0\\.0\\.2:\\d+", pat)
            pat = re.sub(r"\\ +", r"\\s+", pat)
            if not re.search(pat, printed, re.M):
                self.fail(f"README says node {n} prints {line.strip()!r}; "
                          f"it printed:\n{printed}\n{self.logs()}")

    def test_walkthrough(self):
        text = section("## Across machines")
        blocks = fenced(text, "sh")
        outputs = fenced(text, "")
        # Step 1 installs the package; the build tree's programs stand in.
        which_block(blocks, "apt install")
        # Step 2: the key on A, then on B with its mode (scp -p).
        key = which_block(blocks, "umask 077")
        lines = [l for l in key.splitlines() if not l.startswith("scp ")]
        self.assertEqual(len(lines), len(key.splitlines()) - 1,
                         "step 2 should copy the key with one scp line")
        self.run_on("A", "\n".join(lines))
        src = os.path.join(self.tmp, "A", "home", "relay.key")
        dst = os.path.join(self.tmp, "B", "home", "relay.key")
        shutil.copy2(src, dst)
        self.assertEqual(os.stat(dst).st_mode & 0o777, 0o600)
        # Step 3: A serves; step 4: B follows weights/.
        serve = which_block(blocks, "--listen 10.0.0.1:13337")
        self.spawn("A", serve, "relay.log")
        self.wait_for(lambda: "listening on" in self.log("A", "relay.log"),
                      "'listening on' from A's relay")
        started = [o for o in outputs if "listening on" in o]
        self.assertEqual(len(started), 1)
        self.expect_lines(started[0], "A", self.log("A", "relay.log"))
        follow = [b for b in blocks if "--connect 10.0.0.1:13337" in b
                  and "--device" not in b]
        self.assertEqual(len(follow), 1)
        self.spawn("B", follow[0], "relay.log")
        self.wait_for(lambda: "follows 'weights/'" in
                      self.log("A", "relay.log"), "A's 'follows' line")
        self.wait_for(lambda: "connected to" in self.log("B", "relay.log"),
                      "B's 'connected to' line")
        # What step 4 says each relay prints, in its prose.
        prose = text[text.index(follow[0]) + len(follow[0]):]
        prose = prose[prose.index("```") + 3:prose.index("5. ")]
        said, who = [], None
        for m in re.finditer(r"\b(A|B)'s\b|`([^`]+)`", prose):
            if m.group(1):
                who = m.group(1)
            elif who:
                said.append((who, m.group(2)))
        self.assertGreaterEqual(len(said), 3, prose)
        for who, msg in said:
            self.expect_lines(msg, who, self.log(who, "relay.log"))
        # Step 5: publish on A; step 6: get it on B's own daemon.
        self.run_on("A", which_block(blocks, "dlsharectl put weights/"))
        got = self.run_on("B", which_block(blocks, "dlsharectl cat "
                                                   "weights/policy"))
        self.assertEqual(got.split()[:4], ["1", "2", "3", "4"], got)
        self.expect_lines([o for o in outputs if o.startswith("name ")][0],
                          "B", got)
        mirrored = [o for o in outputs if "mirror weights/policy: origin"
                    in o and "local version" in o]
        self.assertEqual(len(mirrored), 1)
        self.expect_lines(mirrored[0], "B", self.log("B", "relay.log"))


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    for name, path in zip(("dlshared", "dlsharectl", "dlshare-relay"),
                          sys.argv[1:]):
        if not os.access(path, os.X_OK):
            print(f"SKIP: test_two_nodes: no {name} at {path}")
            sys.exit(SKIPPED)
        PROGRAMS[name] = path
    why = can_make_nodes()
    if why:
        print(f"SKIP: test_two_nodes: {why}")
        sys.exit(SKIPPED)
    prog = unittest.main(argv=sys.argv[:1], exit=False, verbosity=2)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == "__main__":
    main()
