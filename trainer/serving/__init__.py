"""bin/serve: upstream's websocket policy protocol (protocol.py, msgpack-numpy codec and typed messages), one
Session per connection (session.py), the server (server.py: one model call at a time, API key, limits,
health, signals), its command (cli.py), and the client that speaks to it as upstream's clients do
(client.py).
"""
