"""What bin/serve says when it refuses or drops a client (issue 42, item 6), on a tiny random model
(tests/support/serve_tiny.py):

- a TCP probe (connect, close, no HTTP: `nc -z`, a load balancer; a reset; an HTTP GET of `/` without the
  websocket upgrade) leaves no traceback on the server's real stderr, at most one line for any number of
  probes, and the server goes on serving;
- a connection that sends nothing for --idle-timeout is closed (1001, the reason naming the option), its
  slot freed, said in a WARNING line with the peer address; time its own request waits on the model does
  not count as idle;
- a wrong key (401) and a connection over --max-connections (503) are WARNING lines naming the peer and
  the fix (upstream's client retries both every 5 s and says why only at INFO level);
- bin/serve refuses a negative --idle-timeout in one line, exit 2, before loading anything; a port in use
  is one line, exit 1, before loading anything too (it was said only after the model had loaded).

No sleep synchronises anything: the tests wait for the server's lines, the close frame or the socket's
end, each with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect

from tests.support.runs import REPO
from tests.support.serve_tiny import tiny_served
from trainer.serving.client import PolicyClient
from trainer.serving.protocol import pack, unpack
from trainer.serving.server import Limits, PolicyServer

pytestmark = pytest.mark.fast
KEY, IDLE, DEADLINE = "k3y", 0.5, 60.0


class Lines:
    """The server's say(): its lines, and an event per awaited pattern."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, line: str) -> None:
        with self.cond:
            self.lines.append(line)
            self.cond.notify_all()

    def wait_for(self, pattern: str, count: int = 1) -> list[str]:
        def found() -> list[str]:
            return [line for line in self.lines if re.search(pattern, line)]

        with self.cond:
            assert self.cond.wait_for(lambda: len(found()) >= count, DEADLINE), (pattern, self.lines)
            return found()


@pytest.fixture
def serving():
    def start(limits: Limits):
        said = Lines()
        server = PolicyServer(tiny_served(), limits, said)
        bound, result = threading.Event(), []
        thread = threading.Thread(
            target=lambda: result.append(
                asyncio.run(server.run("127.0.0.1", 0, lambda p: bound.set(), False))
            )
        )
        thread.start()
        assert bound.wait(DEADLINE)
        started.append((server, thread, result))
        return server, said

    started: list = []
    yield start
    for server, thread, result in started:
        server.stop()
        thread.join(DEADLINE)
        assert result == [0]


def test_an_idle_connection_is_closed_and_its_slot_freed(serving):
    server, said = serving(Limits(None, 1, 64 * 1024, IDLE))
    uri = f"ws://127.0.0.1:{server.port}"
    # upstream's client's settings (WebsocketClientPolicy): raw websockets, no pings
    ws = connect(uri, compression=None, max_size=None, ping_interval=None, close_timeout=10)
    port = ws.local_address[1]
    ws.recv(timeout=DEADLINE)  # the metadata
    with pytest.raises(ConnectionClosedOK) as info:
        ws.recv(timeout=DEADLINE)  # the server's close frame ends the wait, after IDLE seconds
    assert info.value.rcvd is not None and info.value.rcvd.code == 1001
    assert "idle for 0.5 s" in info.value.rcvd.reason and "--idle-timeout" in info.value.rcvd.reason
    with pytest.raises(ConnectionClosedOK):  # what upstream's client's next infer() raises
        ws.send(b"\x80")
    warning = said.wait_for(r"WARNING: connection 1 ")[0]
    assert f"from 127.0.0.1:{port}: nothing received for 0.5 s" in warning and "--idle-timeout" in warning
    said.wait_for(r"connection 1 closed \(1001 ")
    client = PolicyClient(uri)  # the one slot is free again
    try:
        assert "server_timing" in client.reset("again")
    finally:
        client.close()


def test_time_spent_waiting_on_the_model_is_not_idle(serving):
    """A's request waits on the model (held by a gate) for longer than the idle timeout: B, which connects
    after A's request went out and sends nothing, is closed for idleness first; A is not, and gets its
    reply when the model is free."""
    server, said = serving(Limits(None, 2, 64 * 1024, IDLE))
    uri = f"ws://127.0.0.1:{server.port}"
    gate = threading.Event()
    held = server.worker.submit(gate.wait, DEADLINE)  # the one model thread, busy until the gate opens
    a = PolicyClient(uri)
    try:
        a.ws.send(pack({"reset": True}))  # queued behind the gate
        b = PolicyClient(uri)
        with pytest.raises(ConnectionClosedOK):
            b.ws.recv(timeout=DEADLINE)
        said.wait_for(r"WARNING: connection 2 .*nothing received")
        gate.set()
        assert held.result(DEADLINE) is True
        reply = a.ws.recv(timeout=DEADLINE)
        assert isinstance(reply, bytes) and "server_timing" in unpack(reply)
        assert not [line for line in said.lines if "WARNING: connection 1 " in line]
    finally:
        gate.set()
        a.close()


def test_refusals_are_warnings_naming_the_peer_and_the_fix(serving):
    server, said = serving(Limits(KEY, 2, 64 * 1024))  # the default idle timeout, 600 s
    uri = f"ws://127.0.0.1:{server.port}"
    with pytest.raises(InvalidStatus) as info:
        PolicyClient(uri, "wrong")
    assert info.value.response.status_code == 401
    line = said.wait_for(r"refused .*HTTP 401")[0]
    assert re.search(r"serve: WARNING: refused 127\.0\.0\.1:\d+ \(HTTP 401\)", line), line
    assert "missing or wrong Authorization" in line  # as tests/test_serve.py reads it
    assert "--api-key-file" in line and "api_key=KEY" in line and "every 5 s" in line
    first, second = PolicyClient(uri, KEY), PolicyClient(uri, KEY)
    try:
        with pytest.raises(InvalidStatus) as info:
            PolicyClient(uri, KEY)
        assert info.value.response.status_code == 503
        line = said.wait_for(r"refused .*HTTP 503")[0]
        assert re.search(r"serve: WARNING: refused 127\.0\.0\.1:\d+ \(HTTP 503\)", line), line
        for client, cid in ((first, 1), (second, 2)):
            assert f"{cid} from 127.0.0.1:{client.ws.local_address[1]} idle " in line, line
        assert "--max-connections" in line and "idle ones close after 600 s" in line and "every 5 s" in line
    finally:
        first.close()
        second.close()


def _pump(stream, out: queue.Queue) -> None:
    for line in stream:
        out.put(line.rstrip("\n"))
    out.put(None)


def test_a_tcp_probe_is_one_quiet_line_and_the_server_goes_on(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.serve_tiny"], cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stderr, lines), daemon=True).start()
    err: list[str] = []
    try:
        while not (port := re.findall(r"listening on ws://127\.0\.0\.1:(\d+)", err[-1] if err else "")):
            line = lines.get(timeout=DEADLINE)
            assert line is not None, "\n".join(err)
            err.append(line)
        for _ in range(2):  # nc -z: connect, send nothing, close
            with socket.create_connection(("127.0.0.1", int(port[0])), timeout=DEADLINE):
                pass
        with socket.create_connection(("127.0.0.1", int(port[0])), timeout=DEADLINE) as probe:  # a reset
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with pytest.raises(urllib.error.HTTPError) as http:  # an HTTP check of `/`, no websocket upgrade
            urllib.request.urlopen(f"http://127.0.0.1:{port[0]}/", timeout=DEADLINE)
        assert http.value.code == 426
        client = PolicyClient(f"ws://127.0.0.1:{port[0]}")
        try:
            assert "server_timing" in client.reset("after the probes")
        finally:
            client.close()
    finally:
        proc.terminate()
        code = proc.wait(DEADLINE)
    while (line := lines.get(timeout=DEADLINE)) is not None:
        err.append(line)
    text = "\n".join(err)
    assert code == 0, text
    assert "Traceback" not in text and "InvalidMessage" not in text, text
    probe = [line for line in err if "handshake" in line or "websockets" in line]
    assert len(probe) <= 1 and all("/healthz" in line for line in probe), text


def test_bin_serve_refuses_a_negative_idle_timeout_in_one_line():
    done = subprocess.run(
        [str(REPO / "bin" / "serve"), "no-such-run", "--idle-timeout", "-1"], cwd=REPO, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == ["serve: --idle-timeout -1: expected seconds >= 0 (0: never)"]


def test_a_port_in_use_is_said_before_anything_loads(capsys, monkeypatch):
    from trainer.serving import cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        argv = ["no-such-run", "--port", str(port), "--host", "127.0.0.1"]  # a TARGET that would fail to load
        monkeypatch.setattr("sys.argv", ["bin/serve", *argv])
        sigterm = signal.getsignal(signal.SIGTERM)  # bin/serve's main installs its own: not this worker's
        try:
            with pytest.raises(SystemExit) as ended:
                cli.main.main(argv, standalone_mode=False)
        finally:
            signal.signal(signal.SIGTERM, sigterm)
    assert ended.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    in_use = "Address already in use; pick another --port (0: any free one, logged)"  # the fix: a review
    assert lines == [f"serve: cannot listen on 127.0.0.1:{port}: {in_use}"], lines


def test_a_client_that_stops_reading_is_dropped_and_a_second_signal_drops_the_rest():
    """Found by a review: a client that sent requests and read no reply held its slot (the idle clock
    paused during the blocked send) and the stop (SIGTERM waited 90 s for it; a second signal was ignored).
    A reply not taken within --idle-timeout drops the connection; at a stop, what still closes after
    STOP_GRACE_S, or at a second signal, is dropped."""
    from websockets.exceptions import ConnectionClosed

    class Stuck:  # a connection whose client's buffers are full: send() never completes
        def __init__(self) -> None:
            self.aborted = 0
            self.transport = self

        def abort(self) -> None:
            self.aborted += 1

        async def send(self, frame) -> None:
            await asyncio.Event().wait()

    said = Lines()
    server = PolicyServer(tiny_served(), Limits(None, 1, 64 * 1024, IDLE), said)
    stuck = Stuck()
    server.idle_since[7], server.conns[7] = ("127.0.0.1:5555", None), stuck

    async def send() -> None:
        with pytest.raises(ConnectionClosed):
            await server._send(stuck, 7, b"reply")

    asyncio.run(send())
    assert stuck.aborted == 1
    assert "connection 7 from 127.0.0.1:5555: a reply waited 0.5 s to be read" in said.wait_for("WARNING")[0]
    server._drop_all("SIGTERM again")
    assert stuck.aborted == 2 and said.wait_for(r"SIGTERM again: dropping 1 connection\(s\)")
