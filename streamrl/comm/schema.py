"""The wire's schema version, in a module of its own so that every module of messages can stamp it."""

# 2: scored groups may carry a model-token mask (a fifth frame). A peer of another version is refused,
# message by message (`schema_version`, naming both versions): the two ends must agree on every frame.
SCHEMA_VERSION = 2
