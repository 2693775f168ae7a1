"""A policy client as upstream's clients are (WebsocketClientPolicy, openpi's): what the replay environment,
the simulator evaluation, the tests and bench/ drive bin/serve with.

    client = PolicyClient("ws://127.0.0.1:29056", api_key=None)
    client.reset(prompt); reply = client.infer({"obs": ...})

websockets' sync client, no compression, no size limit, no pings, `Authorization: Api-Key <key>` when
given a key; the metadata map read on connect; a text reply raised as ServerError (upstream's clients raise
on it), written here with protocol.py's codec.
"""

from __future__ import annotations

from websockets.sync.client import ClientConnection, connect

from trainer.serving.protocol import pack, unpack


class ServerError(RuntimeError):
    """The server answered a request with a text frame (what upstream's clients raise)."""


class PolicyClient:
    def __init__(self, uri: str, api_key: str | None = None, open_timeout: float = 10.0):
        headers = {"Authorization": f"Api-Key {api_key}"} if api_key else None
        self.ws: ClientConnection = connect(
            uri,
            compression=None,
            max_size=None,
            additional_headers=headers,
            ping_interval=None,
            close_timeout=10,
            open_timeout=open_timeout,
        )
        first = self.ws.recv()
        if isinstance(first, str):
            raise ServerError(f"Error in inference server:\n{first}")
        self.metadata = unpack(first)

    def infer(self, obs: dict) -> dict:
        self.ws.send(pack(obs))
        reply = self.ws.recv()
        if isinstance(reply, str):
            raise ServerError(f"Error in inference server:\n{reply}")
        return unpack(reply)

    def reset(self, prompt: str | None = None) -> dict:
        return self.infer({"reset": True} if prompt is None else {"reset": True, "prompt": prompt})

    def close(self) -> None:
        self.ws.close()
