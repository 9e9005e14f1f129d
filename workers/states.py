"""The states of a client connection, in the order it goes through them."""

NEW, AUTHENTICATING, CONNECTING, CONNECTED, CLOSED = range(5)
