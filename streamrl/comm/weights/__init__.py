"""The weight channel, both ends: the learner's newest weights out to every actor.

- `publisher`: the learner's end, each version PUBlished as chunks, and re-broadcast for an actor that asks on the
  control channel (streamrl.comm.control).
- `encoders`: how a version goes on the wire (in full, or as a delta from the one before: transport.weights_delta),
  one interface the publisher sends through without asking which.
- `chunks`: a version of any size as messages under the size cap, and the checks of each on arrival.
- `subscriber` and `assembly`: the actor's end, a version put together from its chunks (or deltas) and checked.
- `collective`: GPU clusters' collective sync (NCCL; gloo in tests), announced on this channel.
- `engine_sync`: the collective's actor end when the engine's own workers are its ranks (vLLM).
- `ipc`: one node's CUDA IPC sync (the actors map the learner's GPU memory), announced on this channel.
"""
