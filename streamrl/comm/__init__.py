"""The wire and transport: msgspec messages, ZeroMQ channels, weights in chunks, the collective broadcast, CurveZMQ."""
