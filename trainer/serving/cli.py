"""bin/serve: serve a checkpoint to a simulator or robot over LingBot-VA's websocket policy protocol.

    bin/serve TARGET [--port 29056] [--host 127.0.0.1] [--set infer.video_steps=2 ...]
                     [--api-key-file F] [--max-connections 4] [--max-frame-bytes 33554432]
                     [--idle-timeout 600]
                     [--config NAME] [--cpu-scale|--full-scale] [--seed N] [--device auto|cpu|cuda]
                     [--camera CLIENT_KEY=RUN_CAMERA ...]

--camera maps the image key a client sends to the run's camera (repeatable; every run camera once), e.g.
LIBERO's client on a run trained on cameras agentview and wrist:
    --camera observation.images.agentview_rgb=agentview --camera observation.images.eye_in_hand_rgb=wrist

TARGET as bin/evaluate's (trainer/sampling/load.py), except that a RUN_DIR with `checkpoints/best` serves
that (the best checkpoint; else the newest complete one). What is served and how: session.py (one session
per connection), server.py (the limits, one request at a time), protocol.py (the wire format); the clients:
docs/evaluation.md. Lines go to stderr; `serve: listening on ws://HOST:PORT` says it is ready (--port 0:
any free port, named there).

Exit codes (trainer/attempt.py): 0 stopped by SIGINT / SIGTERM; 2 bad command line, TARGET, config or key
file (one line naming it); 1 the server failed (the port in use, a failure while loading).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import sys
import traceback
from pathlib import Path

import click

from trainer.attempt import EXIT_FAILED, EXIT_OK, EXIT_USAGE

DEFAULT_PORT = 29056  # upstream's evaluation/libero and robotwin launch scripts
DEFAULT_IDLE_S = 600.0  # an episode's client sends a request every few seconds; a held slot is freed


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class _Stopped(Exception):
    """SIGTERM before the server's loop took the signals over (while loading)."""


class _LoadFailed(Exception):
    """An OSError while loading the model or the data (a file, not the port): named as such."""


def _stop_while_loading(signum, frame) -> None:
    raise _Stopped(signal.Signals(signum).name)


def read_api_key(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        key = Path(path).read_text().strip()
    except OSError as exc:
        raise click.BadParameter(f"--api-key-file {path}: cannot read it ({exc.strerror})") from exc
    if not key or any(c.isspace() for c in key):
        raise click.BadParameter(f"--api-key-file {path}: expected one key on one line, no spaces")
    return key


def _camera_syntax(items: tuple[str, ...]) -> None:
    for item in items:
        key, sep, cam = item.partition("=")
        if not sep or not key.strip() or not cam.strip():
            raise click.BadParameter(f"--camera {item!r}: expected CLIENT_KEY=RUN_CAMERA")


def bindable(host: str, port: int) -> None:
    """Bind each of HOST's addresses at PORT as the server will (SO_REUSEADDR, IPv6 apart), then let go:
    the OSError of a port in use or an address this node lacks, before anything loads. --port 0 (any
    free one) always binds. The server's own bind still decides: the port can be taken in between."""
    if port == 0:
        return
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    for family, kind, proto, _, addr in dict.fromkeys(infos):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            probe.bind(addr)


def serve(target, port, host, sets, api_key_file, max_connections, max_frame_bytes, config, cpu_scale, seed,
          device, cameras=(), idle_timeout=DEFAULT_IDLE_S, scale_flag=None) -> int:  # fmt: skip
    import dataclasses

    from trainer.config import load_config, parse_set  # noqa: F401 - fail fast on a broken install
    from trainer.sampling.load import check_named_config
    from trainer.serving.protocol import parse_aliases
    from trainer.serving.server import Limits, PolicyServer
    from trainer.serving.session import load_served

    _camera_syntax(tuple(cameras))  # before the (slow) load

    key = read_api_key(api_key_file)
    if max_connections < 1:
        raise click.BadParameter(f"--max-connections {max_connections}: expected at least 1")
    if max_frame_bytes < 1024:
        raise click.BadParameter(f"--max-frame-bytes {max_frame_bytes}: expected at least 1024")
    if not 0 <= idle_timeout < float("inf"):  # NaN and inf too
        raise click.BadParameter(f"--idle-timeout {idle_timeout:g}: expected seconds >= 0 (0: never)")
    bindable(host, port)  # a port in use is said now, not after the (slow) load
    try:
        check_named_config(target, config, scale_flag)  # a checkpoint's own config: never ignored unsaid
        served = load_served(target, config or "furniture_train", cpu_scale, list(sets), device, seed, _say)
    except OSError as exc:  # was said as "cannot listen on HOST:PORT" whatever file it was
        raise _LoadFailed(f"loading {target} failed: {exc.filename or ''}: {exc.strerror or exc}") from exc
    try:
        aliases = parse_aliases(tuple(cameras), served.spec.cameras)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    served.spec = dataclasses.replace(served.spec, aliases=aliases)
    for item in served.stand_ins:  # the run was trained on them: its observations are encoded the same way
        _say(f"serve: STAND-IN in use, as in training: {item}")
    spec = served.spec
    _say(
        f"serve: cameras {list(spec.cameras)}"
        + (f" (client keys {list(spec.client_cameras)})" if spec.aliases else "")
        + f"; actions (channels {spec.channels}, frames "
        f"{spec.frames_per_chunk}, per frame {spec.actions_per_frame}) in robot units; "
        f"infer {served.cfg.to_dict()['infer']}"
    )
    _say(
        f"serve: limits: {'API key required' if key else 'no API key'}, {max_connections} connection(s), "
        f"frames up to {max_frame_bytes} bytes; "
        + (f"idle connections closed after {idle_timeout:g} s" if idle_timeout else "idle connections kept")
        + " (--idle-timeout); requests run one at a time"
    )
    limits = Limits(key, max_connections, max_frame_bytes, idle_timeout)
    server = PolicyServer(served, limits, _say)

    def ready(bound: int) -> None:
        _say(f"serve: listening on ws://{host}:{bound} (health: http://{host}:{bound}/healthz)")

    return asyncio.run(server.run(host, port, ready))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="TCP port (0: any free one, logged)",
)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="address to bind (0.0.0.0: every interface)"
)
@click.option("--set", "sets", multiple=True, help="key=value override, e.g. infer.video_steps=2")
@click.option(
    "--api-key-file",
    default=None,
    help="refuse connections without the header 'Authorization: Api-Key <the key in this file>'",
)
@click.option(
    "--max-connections", default=4, show_default=True, help="open connections at most; more are refused"
)
@click.option(
    "--max-frame-bytes",
    default=32 * 2**20,
    show_default=True,
    help="largest request frame; a larger one closes its connection (1009, message too big)",
)
@click.option(
    "--idle-timeout",
    default=DEFAULT_IDLE_S,
    show_default=True,
    help="close a connection that sends nothing for this many seconds, freeing its slot (0: never)",
)
@click.option(
    "--config",
    default=None,
    help="run config for a released folder (default furniture_train); a checkpoint's is its own",
)
@click.option("--cpu-scale/--full-scale", default=None, help="config scale for a released folder")
@click.option("--seed", default=0, show_default=True, help="noise seed (per connection's episode and chunk)")
@click.option("--device", default="auto", show_default=True, help="auto | cpu | cuda")
@click.option(
    "--camera",
    "cameras",
    multiple=True,
    metavar="CLIENT_KEY=RUN_CAMERA",
    help="the image key a client sends for one of the run's cameras (repeatable; every camera once)",
)
def main(target, port, host, sets, api_key_file, max_connections, max_frame_bytes, idle_timeout, config,
         cpu_scale, seed, device, cameras) -> None:  # fmt: skip
    """Serve TARGET's actions over LingBot-VA's websocket policy protocol.

    One session per connection; the model's requests run one at a time. Binds 127.0.0.1 unless --host
    says otherwise; GET /healthz answers OK. SIGINT / SIGTERM: exit 0. Clients: docs/evaluation.md.
    """
    import importlib.util

    import torch

    from trainer.config import ConfigError
    from trainer.data.encoding.folders import EncoderError
    from trainer.data.formats.furniturebench import DatasetError
    from trainer.sampling.load import TargetError

    missing = [m for m in ("websockets", "msgpack") if importlib.util.find_spec(m) is None]
    if missing:  # the provisioned env does not carry them yet; the tool env (pyproject.toml) does
        _say(
            f"serve: {', '.join(missing)} not installed in {sys.executable}; run bin/serve with the tool env"
        )
        sys.exit(EXIT_USAGE)
    signal.signal(signal.SIGTERM, _stop_while_loading)
    scale = (not torch.cuda.is_available()) if cpu_scale is None else cpu_scale
    try:
        code = serve(target, port, host, sets, api_key_file, max_connections, max_frame_bytes, config, scale,
                     seed, device, cameras, idle_timeout, cpu_scale)  # fmt: skip
    except (KeyboardInterrupt, _Stopped):
        _say("serve: stopped while loading")
        code = EXIT_OK
    except (TargetError, ConfigError, DatasetError, EncoderError, click.BadParameter) as exc:
        message = exc.message if isinstance(exc, click.BadParameter) else str(exc)
        _say(f"serve: {message}")
        code = EXIT_USAGE
    except _LoadFailed as exc:
        _say(f"serve: {exc}")
        code = EXIT_FAILED
    except OSError as exc:
        fix = "; pick another --port (0: any free one, logged)" if exc.errno == errno.EADDRINUSE else ""
        _say(f"serve: cannot listen on {host}:{port}: {exc.strerror or exc}{fix}")
        code = EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - one line on the terminal; the traceback under it for the log
        traceback.print_exc(file=sys.stderr)
        _say(f"serve: failed: {type(exc).__name__}: {exc}")
        code = EXIT_FAILED
    sys.exit(code)


if __name__ == "__main__":
    from provision.jsonout import run_click

    run_click(main, "bin/serve")
