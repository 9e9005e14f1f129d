"""The MQTT protocol, and nothing of the broker: framing, packet kinds, topic rules, and the 3.1/3.1.1
(`v4`) and 5.0 (`v5`) codecs side by side. The broker, `bench/` and `tests/` all speak MQTT through it."""
