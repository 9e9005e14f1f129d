"""The states of a client connection, in the order it goes through them. CHALLENGED: an enhanced
authentication exchange that its CONNECT started waits for the client's AUTH; AUTHENTICATING: a
login is being decided (reading waits)."""

NEW, CHALLENGED, AUTHENTICATING, CONNECTING, CONNECTED, CLOSED = range(6)
