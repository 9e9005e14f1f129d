"""The MQTT protocol, and nothing of the broker: framing, packet kinds, topic rules, and the 3.1/3.1.1
(`v4`) and 5.0 (`v5`) codecs side by side. The broker, `bench/` and `tests/` all speak MQTT through it."""

PROTOCOLS = {3: "3.1", 4: "3.1.1", 5: "5.0"}  # CONNECT's protocol level -> the name operators know
