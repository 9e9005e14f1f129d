"""MQTT 5.0 reason codes (section 2.4) with their names, and which packets may carry each."""

from __future__ import annotations

from plexmq.mqtt import kinds

SUCCESS = 0x00  # also: normal disconnection, granted QoS 0
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
RE_AUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_IDENTIFIER_NOT_VALID = 0x85
BAD_USER_NAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_IDENTIFIER_IN_USE = 0x91
PACKET_IDENTIFIER_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

NAMES = {code: name.lower().replace("_", " ") for name, code in globals().items() if name.isupper() and isinstance(code, int)}
NAMES[SUCCESS] = "success"

_ERRORS_COMMON = {0x80, 0x83, 0x87}
# section 2.4, table 2-6, and each packet's reason code table
ALLOWED: dict[int, frozenset[int]] = {
    kinds.CONNACK: frozenset({0x00, *range(0x80, 0x8B), 0x8C, 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}),
    kinds.PUBACK: frozenset({0x00, 0x10, *_ERRORS_COMMON, 0x90, 0x91, 0x97, 0x99}),
    kinds.PUBREC: frozenset({0x00, 0x10, *_ERRORS_COMMON, 0x90, 0x91, 0x97, 0x99}),
    kinds.PUBREL: frozenset({0x00, 0x92}),
    kinds.PUBCOMP: frozenset({0x00, 0x92}),
    kinds.SUBACK: frozenset({0x00, 0x01, 0x02, *_ERRORS_COMMON, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2}),
    kinds.UNSUBACK: frozenset({0x00, 0x11, *_ERRORS_COMMON, 0x8F, 0x91}),
    kinds.DISCONNECT: frozenset({0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, *range(0x8D, 0x91),
                                 *range(0x93, 0xA3)}),
    kinds.AUTH: frozenset({0x00, 0x18, 0x19}),
}


def name(code: int) -> str:
    """The spec's name of a reason code, for logs and reason strings."""
    return NAMES.get(code, f"reason code {code:#04x}")
