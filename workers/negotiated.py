"""What an MQTT 5.0 connection agreed on at CONNECT, kept apart from `Connection` so that a 3.1.1
connection (most of 100k idle clients) pays one empty slot for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from plexmq.mqtt import properties as props
from plexmq.mqtt.connect import Connect
from plexmq.workers.aliases import ALIASES_MAX

if TYPE_CHECKING:
    from plexmq.workers.auth.scram import Exchange


class Negotiated:
    __slots__ = ("receive_max", "max_packet", "alias_max", "aliases", "receiving", "releasing",
                 "session_expiry", "assigned_id", "response_info", "server_keepalive", "auth_method", "exchange",
                 "pending", "auth_data",
                 "send_alias_max", "sent_aliases", "alias_misses")

    def __init__(self, connect: Connect, alias_max: int) -> None:
        p = connect.properties
        # the client's limits on what the broker sends it
        # (a property's value has the type its entry in properties.TABLE says: these are integers)
        self.receive_max: int = p.get(props.RECEIVE_MAXIMUM, 65535)  # type: ignore[assignment]  # an int
        self.max_packet: int = p.get(props.MAXIMUM_PACKET_SIZE, 0)  # type: ignore[assignment]  # 0: no limit
        self.session_expiry: int = p.get(props.SESSION_EXPIRY_INTERVAL, 0)  # type: ignore[assignment]  # an int
        # topic aliases the broker sends (workers/aliases.py): 0 none; in the order of the packets written
        self.send_alias_max: int = min(p.get(props.TOPIC_ALIAS_MAXIMUM, 0), ALIASES_MAX)  # type: ignore[assignment]  # an int
        self.sent_aliases: dict[bytes, int] = {}  # topic -> alias, the least recently used first
        self.alias_misses: dict[bytes, None] = {}  # sent without one while all were taken (a set: 216 bytes, this 64)
        # the broker's limits on what the client sends
        self.alias_max = alias_max
        self.aliases: dict[int, str] = {}  # topic alias -> topic name, set by the client's PUBLISHes
        self.receiving = 0  # QoS 1 PUBLISHes of the client not yet acknowledged
        self.releasing: set[int] = set()  # QoS 2 packet ids of the client awaiting its PUBREL
        self.assigned_id = ""  # the client id the broker chose for an empty one
        self.response_info = bool(p.get(props.REQUEST_RESPONSE_INFORMATION, 0))  # wants response_information
        self.server_keepalive = 0  # the keep alive the broker told it to use instead of its own (max_keepalive)
        # enhanced authentication (workers/handlers/auth.py): the method it logged in with ("": none),
        # the exchange under way (at CONNECT or a re-authentication), the CONNECT that waits for its
        # end, and the broker's last authentication data, which the CONNACK carries
        self.auth_method = ""
        self.exchange: Exchange | None = None
        self.pending: Connect | None = None
        self.auth_data = b""

    def writes_as_is(self) -> bool:
        """Whether a shared QoS 0 packet goes to this client unchanged: no topic alias to choose and no
        packet size limit to check."""
        return not (self.send_alias_max or self.max_packet)
