"""bin/serve's websocket server: upstream's policy protocol (protocol.py) over `websockets`, one Session per
connection (session.py), the model's requests one at a time.

    server = PolicyServer(served, Limits(...), say)
    exit_code = asyncio.run(server.run(host, port))   # until SIGINT / SIGTERM, then 0

Per connection (websockets' asyncio server, openpi's settings: no compression, no pings): the metadata
map on connect, then one reply per request frame: a msgpack map with `server_timing` {infer_ms, queue_ms,
prev_total_ms (from the second request on)}, as upstream's server adds it, or a text frame naming what was
wrong (ProtocolError: the field and what was expected; a failure of the model: its type and message), and
the connection stays open. Every request is one log line (connection, kind, milliseconds); a refused one
too. A connection that sends nothing for --idle-timeout seconds (Limits.idle_timeout; 0: never) is closed
with 1001 (going away) and the reason, freeing its slot; the time its own requests queue or run does not
count.

One model, one request at a time: every model call (encoding, sampling, the cache update) runs on one
worker thread (a ThreadPoolExecutor of one), so requests of different connections queue (their wait is
`queue_ms`) and the event loop keeps accepting, refusing and health-checking meanwhile.

Before a connection gets anything (`process_request`, during the handshake):
    GET /healthz                    200 "OK" (openpi's health check; no key needed, it reveals nothing)
    --api-key-file                  401 unless the header is `Authorization: Api-Key <key>` (what
                                    upstream's WebsocketClientPolicy sends when given api_key)
    --max-connections               503 with the reason when that many are open
Every refusal (a wrong key, over the limit, an idle close) is a `serve: WARNING:` line naming the peer
address and the fix: upstream's client retries a refused handshake every 5 s and says so only at INFO
level, so the server's log is where a waiting client shows (docs/evaluation.md).
A connection that never completes a websocket handshake (a TCP probe: `nc -z`, a load balancer; an HTTP
GET without the upgrade) is one quiet line, the first time only, never websockets' traceback: websockets'
own log goes through `_WebsocketsLog`.
A frame over --max-frame-bytes closes that connection with 1009 (message too big) and the reason, before
it is read into memory. SIGINT or SIGTERM: stop accepting, close the connections (1001 going away), let
the request on the worker finish, return 0. A client that stops reading its replies is closed like an idle
one once a reply has waited --idle-timeout to be taken (its slot was held for good); connections still
open STOP_GRACE_S after the stop, or at a second signal, are dropped, so a stop never waits on a client.
"""

from __future__ import annotations

import asyncio
import hmac
import http
import itertools
import logging
import signal
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidHandshake
from websockets.frames import CloseCode

from trainer.serving.protocol import Executed, Observe, ProtocolError, Reset, decode_request, metadata, pack
from trainer.serving.protocol import Request as Message
from trainer.serving.session import Served, Session

STOP_GRACE_S = 10.0  # after SIGINT/SIGTERM, connections still closing are dropped


@dataclass(frozen=True)
class Limits:
    api_key: str | None = None
    max_connections: int = 4
    max_frame_bytes: int = 32 * 2**20
    idle_timeout: float = 600.0  # seconds a connection may send nothing; 0: never closed for it


class PolicyServer:
    def __init__(self, served: Served, limits: Limits, say: Callable[[str], None]):
        self.served, self.limits, self.say = served, limits, say
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lingbot-model")
        self.open = 0
        self.conns: dict[int, ServerConnection] = {}  # the open connections, dropped at a forced stop
        self.idle_since: dict[
            int, tuple[str, float | None]
        ] = {}  # id -> (peer, waiting since; None: in a request)
        self.ids = itertools.count(1)
        self.port = 0
        self.log = logging.Logger("websockets.server (bin/serve)", logging.WARNING)
        self.log.addHandler(_WebsocketsLog(say))

    # -- the handshake -------------------------------------------------------------------------------
    def _authorised(self, request: Request) -> bool:
        if self.limits.api_key is None:
            return True
        got = request.headers.get("Authorization", "")
        return hmac.compare_digest(got.encode(), f"Api-Key {self.limits.api_key}".encode())

    def process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        peer = _peer(connection)
        if not self._authorised(request):
            self.say(
                f"serve: WARNING: refused {peer} (HTTP 401): missing or wrong Authorization: Api-Key "
                "header; give the client the key in --api-key-file "
                "(WebsocketClientPolicy(host, port, api_key=KEY)). " + RETRIES
            )
            return connection.respond(
                http.HTTPStatus.UNAUTHORIZED,
                "refused: missing or wrong 'Authorization: Api-Key <key>' header (--api-key-file)\n",
            )
        if self.open >= self.limits.max_connections:
            reason = f"refused: {self.open} connections open, the limit (bin/serve --max-connections)"
            self.say(f"serve: WARNING: refused {peer} (HTTP 503): {self._full()}. " + RETRIES)
            return connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE, reason + "\n")
        return None

    def _full(self) -> str:
        """Why a connection is refused for the limit, with the open ones and how long each has been idle."""
        now = time.monotonic()
        held = ", ".join(
            f"{cid} from {peer} " + ("in a request" if since is None else f"idle {now - since:.0f} s")
            for cid, (peer, since) in sorted(self.idle_since.items())
        )
        idle = self.limits.idle_timeout
        closes = f"idle ones close after {idle:g} s (--idle-timeout)" if idle else "--idle-timeout 0: never"
        return (
            f"{self.open} connection(s) open, the limit (open: {held}); close a client that is done, or "
            f"raise --max-connections; {closes}"
        )

    # -- one connection ------------------------------------------------------------------------------
    async def handler(self, ws: ServerConnection) -> None:
        if self.open >= self.limits.max_connections:  # two handshakes raced past process_request
            self.say(f"serve: WARNING: refused {_peer(ws)} (closed 1013): {self._full()}")
            await ws.close(CloseCode.TRY_AGAIN_LATER, "too many connections (bin/serve --max-connections)")
            return
        self.open += 1
        cid = next(self.ids)
        self.idle_since[cid] = (_peer(ws), time.monotonic())
        self.conns[cid] = ws
        self.say(f"serve: connection {cid} from {_peer(ws)} opened ({self.open} open)")
        session = Session(self.served)
        try:
            await self._send(
                ws, cid, pack(metadata(self.served.spec, {"max_frame_bytes": self.limits.max_frame_bytes}))
            )
            await self._requests(ws, cid, session)
        except ConnectionClosed:
            pass
        finally:
            self.open -= 1
            del self.idle_since[cid]
            del self.conns[cid]
            why = (
                f"{ws.close_code} {ws.close_reason or ''}".strip() if ws.close_code is not None else "dropped"
            )
            self.say(f"serve: connection {cid} closed ({why}); {self.open} open")

    async def _requests(self, ws: ServerConnection, cid: int, session: Session) -> None:
        loop = asyncio.get_running_loop()
        prev_total: float | None = None
        while (raw := await self._next(ws, cid)) is not None:
            self.idle_since[cid] = (self.idle_since[cid][0], None)
            start = time.perf_counter()
            try:
                request = decode_request(raw, self.served.spec)
                reply, kind, infer_s = await loop.run_in_executor(self.worker, _run, session, request)
            except ProtocolError as exc:
                self.say(f"serve: connection {cid}: bad request: {exc}")
                await self._send(ws, cid, f"bad request: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - the model failed on this request; the server goes on
                self.say(f"serve: connection {cid}: failed: {type(exc).__name__}: {exc}")
                self.say(traceback.format_exc().rstrip())
                await self._send(ws, cid, f"server error: {type(exc).__name__}: {exc}")
                continue
            total = time.perf_counter() - start
            timing = {"infer_ms": infer_s * 1000, "queue_ms": (total - infer_s) * 1000}
            if prev_total is not None:
                timing["prev_total_ms"] = prev_total * 1000
            reply["server_timing"] = timing
            await self._send(ws, cid, pack(reply))
            prev_total = time.perf_counter() - start
            self.say(
                f"serve: connection {cid}: {kind} {infer_s * 1000:.1f} ms "
                f"(queued {timing['queue_ms']:.1f} ms)"
            )

    async def _send(self, ws: ServerConnection, cid: int, frame: str | bytes) -> None:
        """One frame to the client; a client that has not taken it within --idle-timeout (its buffers full:
        it stopped reading) is dropped, freeing its slot (ConnectionClosed ends the handler). A review found
        one holding its slot, and the stop, for as long as it lived."""
        idle = self.limits.idle_timeout
        try:
            async with asyncio.timeout(idle or None):
                await ws.send(frame)
        except TimeoutError:
            peer = self.idle_since[cid][0]
            self.say(
                f"serve: WARNING: connection {cid} from {peer}: a reply waited {idle:g} s to be read (the "
                "client stopped reading), dropping it to free its slot"
            )
            ws.transport.abort()
            raise ConnectionClosed(None, None) from None

    def _drop_all(self, why: str) -> None:
        if self.conns:
            self.say(f"serve: {why}: dropping {len(self.conns)} connection(s)")
        for ws in list(self.conns.values()):
            ws.transport.abort()

    async def _next(self, ws: ServerConnection, cid: int) -> str | bytes | None:
        """The connection's next frame; None after closing it for --idle-timeout (ConnectionClosed when
        the client closed). Cancelling websockets' recv() loses nothing."""
        peer, _ = self.idle_since[cid]
        self.idle_since[cid] = (peer, time.monotonic())
        idle = self.limits.idle_timeout
        if not idle:
            return await ws.recv()
        try:
            async with asyncio.timeout(idle):
                return await ws.recv()
        except TimeoutError:
            self.say(
                f"serve: WARNING: connection {cid} from {peer}: nothing received for {idle:g} s, closing "
                "it (1001) to free its slot; its client's next request raises ConnectionClosedOK: reconnect, "
                "or raise bin/serve --idle-timeout (0: never)"
            )
            await ws.close(CloseCode.GOING_AWAY, f"idle for {idle:g} s (bin/serve --idle-timeout)")
            return None

    # -- the process ---------------------------------------------------------------------------------
    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop as SIGTERM does, from any thread (a server run off the main thread: the benchmark)."""
        loop, on_signal = self._stop
        loop.call_soon_threadsafe(on_signal, int(sig))

    async def run(
        self, host: str, port: int, ready: Callable[[int], None] | None = None, signals: bool = True
    ) -> int:
        loop = asyncio.get_running_loop()
        stop: asyncio.Future[int] = loop.create_future()

        def on_signal(sig: int) -> None:
            if not stop.done():
                stop.set_result(sig)
            else:  # a second signal: nothing waits on a client any more
                self._drop_all(f"{signal.Signals(sig).name} again")

        self._stop = (loop, on_signal)

        for each in (signal.SIGINT, signal.SIGTERM) if signals else ():
            loop.add_signal_handler(each, on_signal, int(each))
        async with serve(
            self.handler,
            host,
            port,
            process_request=self.process_request,
            logger=self.log,
            max_size=self.limits.max_frame_bytes,
            compression=None,
            ping_interval=None,
            ping_timeout=None,
        ) as server:
            self.port = int(next(iter(server.sockets)).getsockname()[1])
            if ready is not None:
                ready(self.port)
            sig = await stop
            self.say(f"serve: {signal.Signals(sig).name}: stopping (closing {self.open} connection(s))")
            server.close()
            try:
                async with asyncio.timeout(STOP_GRACE_S):
                    await server.wait_closed()
            except TimeoutError:
                self._drop_all(f"still closing {STOP_GRACE_S:g} s after the stop")
                await server.wait_closed()
        await loop.run_in_executor(None, self.worker.shutdown, True)
        self.say("serve: stopped")
        return 0


def _run(session: Session, request: Message) -> tuple[dict, str, float]:
    """On the worker thread: one request -> (reply map, its kind, seconds it took)."""
    start = time.perf_counter()
    reply: dict
    if isinstance(request, Reset):
        session.reset(request.prompt, request.episode_seed)
        reply, kind = {}, "reset"
    elif isinstance(request, Executed):
        session.executed(request.frames, request.state)
        reply, kind = {}, f"compute_kv_cache ({len(request.frames)} frames)"
    else:
        assert isinstance(request, Observe)
        chunk = session.chunk
        reply, kind = {"action": session.observe(request.frame)}, f"chunk {chunk}"
    return reply, kind, time.perf_counter() - start


RETRIES = (
    "Upstream's client retries every 5 s and logs why at INFO level only: it waits in silence until this is "
    "fixed"
)


class _WebsocketsLog(logging.Handler):
    """websockets' own records (WARNING and up) as say lines. An opening handshake that failed on what
    the peer sent or did not send (a TCP probe that connects and closes, a reset, an HTTP GET without
    the websocket upgrade: a load balancer's check of `/`, a browser) is one line without traceback, said
    the first time only; anything else is said with its traceback."""

    def __init__(self, say: Callable[[str], None]):
        super().__init__(logging.WARNING)
        self.say, self.probes = say, 0

    def emit(self, record: logging.LogRecord) -> None:
        exc = record.exc_info[1] if record.exc_info else None
        if record.getMessage() == "opening handshake failed" and isinstance(
            exc, InvalidHandshake | EOFError | ConnectionError
        ):
            self.probes += 1
            if self.probes == 1:
                ws = getattr(record, "websocket", None)
                peer = _peer(ws) if isinstance(ws, ServerConnection) else "a client"
                self.say(
                    f"serve: {peer} connected without a websocket handshake ({exc or type(exc).__name__}): "
                    "a probe? GET /healthz is for probes; further ones are not logged"
                )
            return
        self.say(f"serve: websockets: {record.getMessage()}")
        if record.exc_info:
            self.say("".join(traceback.format_exception(*record.exc_info)).rstrip())


def _peer(connection: ServerConnection) -> str:
    address = connection.remote_address
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)
