"""The hook's unit tests for any python3 >= 3.8: standard library only, no pytest, no Horovod.

`python3 hook_unittests.py HOOK_DIR [unittest args]`, HOOK_DIR holding the
`elastic_supervisor_hook` package (supervisor/hook). tests/integration/test_hook_pythons.py runs
it with Debian bullseye's python3 (3.9) and trixie's (3.13) in minimal Debian trees
(localcluster/pythons.py), and with the project's own. Horovod is in none of them: small fake
`horovod` packages in a temporary directory stand in for the modules the hook patches
(`horovod.torch.mpi_ops`, `horovod.mxnet.mpi_ops`); the real ones are the other tests'
(tests/unit/test_hook_channel.py, tests/integration/test_hook_loading.py). Everything else is
real: UDP and TCP sockets on loopback, /proc, psutil where the interpreter has it, the process
watcher as a child process.

The first line printed names the interpreter and psutil: `hook-tests: python X.Y.Z psutil V`.
"""

import contextlib
import hashlib
import hmac
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import unittest
from collections import namedtuple

HOOK_DIR = sys.argv.pop(1) if __name__ == "__main__" else os.environ["HOOK_DIR"]
sys.path.insert(0, HOOK_DIR)

import elastic_supervisor_hook as hook  # noqa: E402
from elastic_supervisor_hook import driver, watch, wire, worker  # noqa: E402

KEY = b"k" * 32
Conn = namedtuple("Conn", "laddr raddr fd status")  # psutil's pconn, the fields the hook reads
CONNS = [
    Conn(("10.0.0.1", 40000), ("10.0.0.9", 5000), 10, "ESTABLISHED"),  # to the dead pod
    Conn(("10.0.0.1", 40001), ("10.0.0.9", 5001), 11, "ESTABLISHED"),  # to the dead pod
    Conn(("10.0.0.1", 40002), ("10.0.0.2", 5000), 12, "ESTABLISHED"),  # to a live pod
    Conn(("10.0.0.1", 40003), ("10.0.0.5", 8000), 13, "ESTABLISHED"),  # to the launcher
    Conn(("127.0.0.1", 40004), ("127.0.0.1", 33001), 14, "ESTABLISHED"),  # loopback: dead
    Conn(("127.0.0.1", 40005), ("127.0.0.1", 33002), 15, "ESTABLISHED"),  # loopback: live
    Conn(("10.0.0.1", 40006), ("10.0.0.9", 5002), 16, "CLOSE_WAIT"),
    Conn(("::ffff:10.0.0.1", 40007), ("::ffff:10.0.0.9", 5003), 17, "ESTABLISHED"),
]


def udp() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.settimeout(10)
    return s


def received(sock: socket.socket, want, key: bytes = KEY, timeout: float = 10.0) -> dict:
    """The first authentic datagram body on `sock` for which want(body) is true."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        body = wire.decode(key, sock.recv(wire.MAX_DATAGRAM))
        if body is not None and want(body):
            return body
    raise AssertionError(f"no datagram as wanted within {timeout} s")


def tcp_pair():
    """A listener, our connected end and the peer's end, on loopback."""
    srv = socket.create_server(("127.0.0.1", 0))  # 3.8
    cli = socket.create_connection(srv.getsockname())
    peer, _ = srv.accept()
    return srv, cli, peer


def supervisor_says(body: dict, n: int) -> bytes:
    return wire.encode(KEY, dict(body, s=wire.SUPERVISOR, n=n))


class Wire(unittest.TestCase):
    def test_a_datagram_decodes_only_with_its_key_and_untouched(self):
        body = {"t": "hb", "s": "abc", "n": 1, "host": "10.0.0.1", "problems": ["x"]}
        data = wire.encode(KEY, body)
        self.assertEqual(wire.decode(KEY, data), body)
        self.assertIsNone(wire.decode(b"f" * 32, data))
        tampered = data[:-2] + bytes([data[-2] ^ 1]) + data[-1:]
        self.assertIsNone(wire.decode(KEY, tampered))
        self.assertIsNone(wire.decode(KEY, data[:30]))
        self.assertIsNone(wire.decode(KEY, b"XXXX" + data[4:]))

    def test_authentic_bodies_without_a_type_sender_or_number_are_dropped(self):
        for body in ({"t": "nope", "s": "a", "n": 1}, {"t": "hb", "n": 1},
                     {"t": "hb", "s": "a", "n": True}, {"t": "hb", "s": "a", "n": "1"}, [1]):
            payload = json.dumps(body).encode()
            data = wire.MAGIC + hmac.new(KEY, payload, hashlib.sha256).digest() + payload
            self.assertIsNone(wire.decode(KEY, data), body)

    def test_authentic_bodies_a_parser_chokes_on_are_dropped_not_raised(self):
        for payload in (b'{"t":"hb","s":"a","n":1,"x":' + b"[" * 50000,
                        b'{"t":["hb"],"s":"a","n":1}', b'{"t":"hb","s":"a","n":1,"w":1e400}',
                        b'{"t":"hb","s":"a","n":1,"w":NaN}', b"\xff"):
            data = wire.MAGIC + hmac.new(KEY, payload, hashlib.sha256).digest() + payload
            self.assertIsNone(wire.decode(KEY, data), payload[:40])

    def test_an_oversized_body_is_refused_before_sending(self):
        with self.assertRaises(ValueError):
            wire.encode(KEY, {"t": "hb", "s": "a", "n": 1, "x": "y" * wire.MAX_DATAGRAM})

    def test_replays_are_refused_per_sender_and_the_oldest_sender_forgotten(self):
        r = wire.Replays(limit=2)
        self.assertEqual([r.accept("a", 1), r.accept("a", 1), r.accept("a", 2),
                          r.accept("b", 1), r.accept("c", 1), r.accept("a", 1)],
                         [True, False, True, True, True, True])

    def test_keys_are_hex_of_at_least_16_bytes(self):
        self.assertEqual(wire.parse_key(" " + "ab" * 16 + "\n", "K"), b"\xab" * 16)
        for text, why in (("xyz", "expected hex digits"), ("ab" * 8, "got 8 bytes")):
            with self.assertRaises(ValueError) as e:
                wire.parse_key(text, "K")
            self.assertIn(why, str(e.exception))
        with self.assertRaises(ValueError) as e:
            wire.read_key("/nonexistent/hook-key", "F")
        self.assertTrue(str(e.exception).startswith("F: cannot read it"))


class Connections(unittest.TestCase):
    def test_severable_cuts_a_dead_hosts_connections_only(self):
        table = [
            ([], [], []),
            ([("10.0.0.9", None)], [], [10, 11, 17]),
            ([("10.0.0.5", None)], [("10.0.0.5", 8000)], []),
            ([("127.0.0.1", (33001,))], [], [14]),
            ([("127.0.0.1", ())], [], []),
            ([("127.0.0.1", (33001,)), ("127.0.0.1", None)], [], [14, 15]),
        ]
        for dead, keep, fds in table:
            self.assertEqual(worker.severable(CONNS, dead, keep), fds, dead)

    def test_the_world_is_what_the_init_opened_and_endpoints_are_listed(self):
        before = worker.links(CONNS[:2] + CONNS[3:4])
        after = worker.links(CONNS)
        self.assertEqual(len(after), 7)
        world = worker.world_links(before, after, keep=[("127.0.0.1", 33002)])
        self.assertEqual(sorted(after[link] for link in world), [12, 14, 17])
        self.assertEqual(worker.local_endpoints(CONNS),
                         (["10.0.0.1", "127.0.0.1"], [40004, 40005]))

    def test_proc_tables_parse_as_psutil_shows_them(self):
        sockets = {1001: 7, 1002: 8}
        v4 = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   "
              "uid  timeout inode\n"
              "   0: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     "
              "0        0 1001 1 0000000000000000 20 4 30 10 -1\n"
              "   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     "
              "0        0 1002 1 0000000000000000 100 0 0 10 0\n"
              "   2: 0100007F:1F91 0100007F:9C41 01 00000000:00000000 00:00000000 00000000     "
              "0        0 9999 1 0000000000000000 20 4 30 10 -1\n")
        self.assertEqual(worker.parse_proc_tcp(v4, sockets, little_endian=True), [
            worker.Connection(7, ("127.0.0.1", 8080), ("127.0.0.1", 40000), "ESTABLISHED"),
            worker.Connection(8, ("0.0.0.0", 22), (), "LISTEN")])
        v6 = ("  sl  local_address                         remote_address                        "
              "st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
              "   0: 0000000000000000FFFF00000100000A:1F90 0000000000000000FFFF00000900000A:1388 "
              "01 00000000:00000000 00:00000000 00000000     0        0 1001 1 0 20 4 30 10 -1\n")
        self.assertEqual(worker.parse_proc_tcp(v6, sockets, little_endian=True), [
            worker.Connection(7, ("::ffff:10.0.0.1", 8080), ("::ffff:10.0.0.9", 5000),
                              "ESTABLISHED")])

    def test_proc_and_psutil_see_the_same_connections_of_this_process(self):
        srv, cli, peer = tcp_pair()
        try:
            from_proc = worker.links(worker.proc_tcp_connections())
            self.assertEqual(from_proc[(cli.getsockname(), cli.getpeername())], cli.fileno())
            self.assertEqual(from_proc[(peer.getsockname(), peer.getpeername())], peer.fileno())
            try:
                import psutil  # noqa: F401
            except ImportError:
                self.skipTest("psutil is not installed for this interpreter")
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                from_psutil = worker.links(worker.TcpConnections()())
            self.assertEqual(from_psutil, from_proc)
            self.assertEqual(err.getvalue(), "")
        finally:
            for s in (srv, cli, peer):
                s.close()

    def test_the_udp_tables_give_this_process_s_udp_sockets(self):
        """What the real-node tests read of a pod's process (its heartbeat socket's port, in its
        own network namespace): the same reader with the udp tables."""
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        udp.bind(("127.0.0.1", 0))
        srv, cli, peer = tcp_pair()
        try:
            ours = [(c.fd, c.laddr) for c in
                    worker.proc_tcp_connections("/proc/self", ("udp", "udp6"))]
            self.assertIn((udp.fileno(), udp.getsockname()), ours)
            tcp = {s.fileno() for s in (srv, cli, peer)}
            self.assertEqual([fd for fd, _ in ours if fd in tcp], [])
        finally:
            for s in (udp, srv, cli, peer):
                s.close()

    def test_the_round_trip_of_a_link_is_read_from_the_kernel(self):
        """The stragglers' slow link: tcp_info's smoothed round trip of a connection that just
        sent data, under this interpreter; a reading of it, and the means a heartbeat sends."""
        srv, cli, peer = tcp_pair()
        try:
            for _ in range(20):
                cli.sendall(b"x" * 1000)
                peer.recv(4096)
            read = worker.tcp_rtt(cli.fileno(), "127.0.0.1")
            self.assertIsNotNone(read)
            rtt_us, idle_ms = read
            self.assertTrue(0 < rtt_us < 1000000 and idle_ms < 5000, read)
            self.assertIsNone(worker.tcp_rtt(cli.fileno(), "10.9.9.9"))
            times = worker.LinkTimes()
            times.add(worker.peer_rtts([("10.1.0.2", rtt_us, idle_ms)]))
            self.assertEqual(times.means(), {"10.1.0.2": round(rtt_us / 1000, 3)})
        finally:
            for s in (srv, cli, peer):
                s.close()

    def test_without_psutil_the_connections_come_from_proc_said_once(self):
        srv, cli, peer = tcp_pair()
        saved = sys.modules.get("psutil")
        sys.modules["psutil"] = None  # type: ignore[assignment]  # import psutil: ImportError
        try:
            read, err = worker.TcpConnections(), io.StringIO()
            with contextlib.redirect_stderr(err):
                first, second = worker.links(read()), worker.links(read())
            self.assertEqual(first[(cli.getsockname(), cli.getpeername())], cli.fileno())
            self.assertEqual(first, second)
            self.assertEqual(err.getvalue().splitlines(), [
                "elastic-supervisor hook: psutil is not installed: this process's TCP "
                "connections are read from /proc instead"])
        finally:
            if saved is None:
                del sys.modules["psutil"]
            else:
                sys.modules["psutil"] = saved
            for s in (srv, cli, peer):
                s.close()


class Heartbeats(unittest.TestCase):
    def setUp(self):
        self.rx = udp()
        self.addCleanup(self.rx.close)

    def beater(self, progress, start: bool = False, **kw) -> worker.Beater:
        b = worker.Beater(progress, key=KEY, supervisor=self.rx.getsockname(), run="1",
                          host="10.0.0.1", local_rank=0, keep=[], **kw)
        if start:
            b.start()
        self.addCleanup(b.close if start else b.sock.close)
        return b

    def test_a_heartbeat_says_what_the_process_does(self):
        progress = worker.Progress()
        release = threading.Event()
        collective = progress.wrap(lambda: release.wait(10), "c")
        release.set()
        collective()  # one completed
        release.clear()
        inside = threading.Thread(target=collective, daemon=True)
        inside.start()
        self.addCleanup(release.set)
        self.beater(progress, start=True, problems=["a problem"], connections=lambda: CONNS)
        body = received(self.rx, lambda b: b["t"] == "hb" and b["in"] == "c" and b["wait"] > 0)
        self.assertEqual((body["host"], body["lr"], body["done"], body["dc"], body["run"]),
                         ("10.0.0.1", 0, 1, 1, "1"))
        self.assertEqual((body["addrs"], body["ports"]),
                         (["10.0.0.1", "127.0.0.1"], [40004, 40005]))
        self.assertEqual(body["problems"], ["a problem"])
        self.assertTrue(body["pos"])
        self.assertEqual(body["pid"], os.getpid())
        release.set()
        inside.join(5)
        body = received(self.rx, lambda b: b["t"] == "hb" and b["done"] == 2)
        self.assertIsNone(body["wait"])

    def test_a_fence_push_cuts_the_dead_peers_connection_at_once(self):
        for fence in (True, False):
            srv, cli, peer = tcp_pair()
            try:
                cli.settimeout(1)
                mine = [worker.Connection(cli.fileno(), cli.getsockname(), cli.getpeername(),
                                          "ESTABLISHED")]
                b = self.beater(worker.Progress(), connections=lambda c=mine: c, fence=fence)
                b.receive(supervisor_says({"t": "fence", "v": 1, "dead": [
                    ["127.0.0.1", [peer.getsockname()[1]]]]}, 1), b.supervisor)
                self.assertEqual(b.fence_version, 1, "the version is recorded either way")
                if fence:
                    self.assertEqual(cli.recv(10), b"", "shut down: end of file at once")
                else:
                    peer.sendall(b"ok")
                    self.assertEqual(cli.recv(10), b"ok", "an unfenced process cuts nothing")
            finally:
                for s in (srv, cli, peer):
                    s.close()

    def test_the_supervisor_tells_a_process_of_an_old_run_to_exit(self):
        exits = []
        b = self.beater(worker.Progress(), connections=lambda: [], exit_process=exits.append)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            b.receive(supervisor_says({"t": "exit", "run": "1", "why": "restarted"}, 1),
                      b.supervisor)
            b.receive(supervisor_says({"t": "exit", "run": "1", "why": "replayed"}, 1),
                      b.supervisor)
            b.receive(wire.encode(KEY, {"t": "exit", "s": "someone", "n": 2, "run": "1"}),
                      b.supervisor)
        self.assertEqual(exits, [1])
        self.assertIn("exiting: restarted", err.getvalue())

    def test_only_the_supervisors_address_may_command(self):
        """Every process of the job holds the key: one that signs a fence or an exit as the
        supervisor, even with a sequence number far ahead, is not the supervisor's address."""
        exits = []
        b = self.beater(worker.Progress(), connections=lambda: [], exit_process=exits.append)
        host, port = b.supervisor
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            for source in ((host, port + 1), ("10.0.0.7", port), ("10.0.0.7", port + 2)):
                b.receive(supervisor_says({"t": "exit", "run": "1", "why": "forged"}, 10**12),
                          source)
                b.receive(supervisor_says({"t": "fence", "v": 99, "dead": [
                    ["127.0.0.1", None]]}, 10**12 + 1), source)
        self.assertEqual((exits, b.fence_version, b.foreign), ([], 0, 6))
        self.assertEqual(len(b.problems), 1, "said once")
        self.assertIn(f"(first {host}:{port + 1})", b.problems[0])
        # the real supervisor is not locked out by the forged sequence numbers
        b.receive(supervisor_says({"t": "fence", "v": 1, "dead": []}, 1), b.supervisor)
        self.assertEqual(b.fence_version, 1)

    def test_the_process_watcher_reports_this_process_and_stops_without_it(self):
        line = ("4242 (python (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 750 125 0 0 20 0 9 "
                "0 1000 10000 100 18446744073709551615")
        self.assertEqual(watch.parse_stat(line), ("S", 875))
        parents = iter([os.getpid(), os.getpid(), -1])  # -1: gone (pid 1 may be ours)
        sent = watch.run(KEY, self.rx.getsockname(), "1", "abc", os.getpid(),
                         parent=lambda: next(parents), sleep=lambda _: None)
        self.assertEqual(sent, 2)
        body = received(self.rx, lambda b: b["t"] == "ps")
        self.assertEqual((body["of"], body["pid"]), ("abc", os.getpid()))
        self.assertIn(body["state"], ("R", "S"))


WORKER_ENV = {"HOROVOD_HOSTNAME": "127.0.0.5", "HOROVOD_LOCAL_RANK": "0",
              "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1"}


class Install(unittest.TestCase):
    def test_the_role_comes_from_the_environment(self):
        base = {hook.KEY_ENV: KEY.hex(), hook.PORT_ENV: "9"}
        table = [
            ({}, [], None),
            ({hook.KEY_ENV: KEY.hex()}, [], None),
            ({**base, hook.PORT_ENV: "x"}, [], None),
            (base, ["horovodrun"], "driver"),
            ({hook.KEY_FILE_ENV: "/k", hook.PORT_ENV: "9"}, [], "driver"),
            ({**base, **WORKER_ENV}, ["train.py"], "worker"),
            ({**base, **WORKER_ENV, hook.WORKER_ENV: "0"}, [], None),
            ({**base, **WORKER_ENV}, ["-c", "--multiprocessing-fork"], None),
        ]
        for env, argv, role in table:
            self.assertEqual(hook.role(env, argv), role, (env, argv))

    def test_a_bad_key_is_said_once_and_nothing_is_installed(self):
        before, err = list(sys.meta_path), io.StringIO()
        with contextlib.redirect_stderr(err):
            got = hook.install({hook.KEY_ENV: "xyz", hook.PORT_ENV: "9"})
        self.assertIsNone(got)
        self.assertEqual(sys.meta_path, before)
        self.assertEqual(len(err.getvalue().splitlines()), 1)
        self.assertIn("ELASTIC_SUPERVISOR_HOOK_KEY: expected hex digits", err.getvalue())

    def test_the_driver_gets_the_finder_first_and_its_settings_checked(self):
        with tempfile.TemporaryDirectory() as tmp:
            key_file = os.path.join(tmp, "hook-key")
            with open(key_file, "w") as f:
                f.write(KEY.hex())
            env = {hook.KEY_FILE_ENV: key_file, hook.PORT_ENV: "9"}
            self.assertEqual(hook.key_of(env), KEY)
            self.assertEqual(hook.install(env), "driver")
            finder = sys.meta_path.pop(0)
        self.assertEqual(type(finder).__name__, "_Finder")
        self.assertEqual(sorted(finder.patches), [hook.NETWORK, hook.DRIVER])
        self.assertEqual(hook.join_timeout(None), (driver.JOIN_TIMEOUT_S, ""))
        self.assertEqual(hook.join_timeout("30"), (30.0, ""))
        self.assertIn("is not a number of seconds > 0", hook.join_timeout("inf")[1])

    def test_the_drivers_pure_patches_on_stand_ins(self):
        network = types.ModuleType("network")
        network.socket = socket
        network.BasicClient = type("BasicClient", (), {"_send_one": None, "_probe_one": None})
        driver.timed_sockets(network)
        self.assertIs(network.socket.socket, driver.TimedSocket)
        self.assertIs(socket.socket, network.socket.socket.__mro__[1], "the real one untouched")
        remote = types.ModuleType("remote")
        remote.SSH_COMMAND_PREFIX = "ssh -o PasswordAuthentication=no " + driver.UNCHECKED
        remote.get_ssh_command = lambda: None
        driver.pin_host_keys(remote, "/etc/job secret/known_hosts")
        self.assertEqual(remote.SSH_COMMAND_PREFIX, "ssh -o PasswordAuthentication=no -o "
                         "StrictHostKeyChecking=yes -o UserKnownHostsFile='/etc/job "
                         "secret/known_hosts'")
        with tempfile.TemporaryDirectory() as tmp:
            dead = os.path.join(tmp, "hostfile.dead")
            self.assertEqual(driver.read_dead(dead), frozenset())
            with open(dead, "w") as f:
                json.dump(["10.0.0.9", 7], f)
            self.assertEqual(driver.read_dead(dead), frozenset({"10.0.0.9"}))


class SiteCustomize(unittest.TestCase):
    def test_python_loads_the_hook_at_start_up_after_the_sitecustomize_it_hides(self):
        with tempfile.TemporaryDirectory() as other:
            with open(os.path.join(other, "sitecustomize.py"), "w") as f:
                f.write("import os\nos.environ['OTHER_RAN'] = '1'\n")
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), hook.KEY_ENV: KEY.hex(),
                   hook.PORT_ENV: "9", "PYTHONPATH": os.pathsep.join([HOOK_DIR, other])}
            got = subprocess.run(
                [sys.executable, "-c", "import os, sys; print(os.environ.get('OTHER_RAN'), "
                 "type(sys.meta_path[0]).__name__, sys.modules['sitecustomize'].__file__)"],
                env=env, capture_output=True, text=True, timeout=60, check=False)
        self.assertEqual(got.stderr, "")
        self.assertEqual(got.stdout.split(), [
            "1", "_Finder", os.path.join(os.path.abspath(HOOK_DIR), "sitecustomize.py")])


FAKE_HOROVOD = {
    "horovod/__init__.py": "__version__ = '0.28.1'\n",
    "horovod/torch/__init__.py": "from horovod.torch.mpi_ops import init, synchronize, rank\n",
    "horovod/torch/mpi_ops.py": ("def synchronize(handle):\n    return handle\n"
                                 "def init():\n    pass\n"
                                 "def rank():\n    return 0\n"
                                 "def size():\n    return 1\n"),
    "horovod/mxnet/__init__.py": "from horovod.mxnet.mpi_ops import init\n",
    "horovod/mxnet/mpi_ops.py": "def init():\n    pass\n",
}


class Patching(unittest.TestCase):
    """install() in a training process, then a fake Horovod imported: the finder patches it."""

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)
        for name, text in FAKE_HOROVOD.items():
            path = os.path.join(self.tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        self.rx = udp()
        self.addCleanup(self.rx.close)
        env = {**WORKER_ENV, hook.KEY_ENV: KEY.hex(), hook.RUN_ENV: "3",
               hook.PORT_ENV: str(self.rx.getsockname()[1])}
        # The process watcher reads the hook's settings from the real environment.
        saved = dict(os.environ)
        os.environ.update(env)
        self.addCleanup(lambda: (os.environ.clear(), os.environ.update(saved)))
        sys.path.insert(0, self.tmp)
        self.addCleanup(sys.path.remove, self.tmp)
        self.addCleanup(self.forget_horovod)
        self.assertEqual(hook.install(env), "worker")
        self.finder = sys.meta_path[0]
        self.addCleanup(sys.meta_path.remove, self.finder)
        self.hook = self.finder.done.__self__
        self.addCleanup(self.stop_beater)

    def stop_beater(self):
        if self.hook.beater is not None:
            self.hook.beater.close()

    @staticmethod
    def forget_horovod():
        for name in [n for n in sys.modules if n == "horovod" or n.startswith("horovod.")]:
            del sys.modules[name]

    def test_horovod_torch_is_wrapped_where_it_is_imported_and_heartbeats_from_init(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            import horovod.torch as hvd
        self.assertTrue(hasattr(hvd.synchronize, "__wrapped__"), "the name imported from it")
        self.assertIsNone(self.hook.beater, "no heartbeat before the first init")
        hvd.init()
        self.assertEqual(hvd.synchronize(5), 5)
        body = received(self.rx, lambda b: b["t"] == "hb" and b["done"] == 2)
        self.assertEqual((body["rank"], body["size"], body["inits"], body["host"], body["run"]),
                         (0, 1, 1, "127.0.0.5", "3"))
        self.assertEqual(body["problems"], [])
        self.assertTrue(self.hook.beater.fence)
        ps = received(self.rx, lambda b: b["t"] == "ps")  # its watcher, a child process
        self.assertEqual((ps["pid"], ps["of"]), (os.getpid(), self.hook.beater.sender))
        self.assertNotIn("elastic-supervisor hook", err.getvalue())

    def test_horovod_mxnet_is_said_unfenced_once_and_in_every_heartbeat(self):
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            import horovod.mxnet
            import horovod.mxnet.mpi_ops  # noqa: F401  # imported again: said once
        problem = hook.unfenced_problem("horovod.mxnet")
        said = [line for line in err.getvalue().splitlines() if "elastic-supervisor" in line]
        self.assertEqual(said, [
            f"elastic-supervisor hook: {problem} (no fence and no hang detection for this "
            "process; horovodrun's driver is hardened all the same)"])
        self.assertEqual(hook.unfenced_framework(problem), "horovod.mxnet")
        self.assertIsNone(hook.unfenced_framework("Horovod 0.27.0 is not 0.28.x"))
        for _ in range(2):
            body = received(self.rx, lambda b: b["t"] == "hb")
            self.assertEqual(body["problems"], [problem])
        self.assertFalse(self.hook.beater.fence, "it cuts nothing")


def main() -> int:
    try:
        import psutil
        version = psutil.__version__
    except ImportError:
        version = "none"
    print(f"hook-tests: python {'.'.join(map(str, sys.version_info[:3]))} psutil {version}",
          flush=True)
    program = unittest.main(module=__name__, exit=False, verbosity=1)
    return 0 if program.result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
