"""Stand-ins the tests use in place of what they cannot run here: engines (fake_vllm, fake_sglang), Slurm and
the launchers (slurm_stub, run by its path), an OpenAI-compatible endpoint (openai_server), malformed wire
messages (malformed) and a PUB/SUB join helper (pubsub). Imported as `fakes.<module>`: tests/ is on sys.path
through tests/conftest.py."""
