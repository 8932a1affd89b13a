"""streamrl's own objectives as plug-ins: each one's options (the `loss` keys only it takes) and where it lives,
declared without importing torch (the entry points of group `streamrl.losses` name these; pyproject.toml). The
config parses an objective's keys by its Struct here; the learner passes them to the objective as keywords."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta

from streamrl.registry import Options, Plugin

Ratio = Annotated[float, Meta(ge=1)]


class PPOOptions(Options):
    """PPO's clip against the behaviour policy, with a dual clip for A < 0."""

    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 for the importance ratio."""
    clip_high: Annotated[float, Meta(ge=0)] = 0.2
    """PPO clip range above 1 for the importance ratio."""
    is_cap: Ratio = 2.0
    """Truncation cap on the importance ratio where PPO clipping does not bound it (A < 0)."""


class TISOptions(Options):
    """Truncated importance sampling: vanilla policy gradient weighted by min(ratio, C)."""

    tis_cap: Ratio = 2.0
    """Truncation cap C on the importance weight min(ratio, C)."""


class DecoupledPPOOptions(Options):
    """AReaL's decoupled PPO: PPO's clip against the proximal policy, times the behaviour weight."""

    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 for the ratio against the proximal policy."""
    clip_high: Annotated[float, Meta(ge=0)] = 0.2
    """PPO clip range above 1 for the ratio against the proximal policy."""
    tis_cap: Ratio = 2.0
    """Truncation cap on the behaviour weight pi_prox / pi_behaviour."""


class MISOptions(Options):
    """Masked importance sampling (IcePop): a token whose ratio leaves [mis_low, mis_high] gets no gradient."""

    mis_low: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """A token whose ratio pi_theta / pi_behaviour is below this gets no gradient (IcePop: 0.5)."""
    mis_high: Ratio = 5.0
    """A token whose ratio is above this gets no gradient (IcePop: 5)."""


class SeqMaskOptions(Options):
    """Sequence geometric-mean masking, then token TIS."""

    seq_mask_low: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """A sequence whose geometric-mean ratio exp(mean log ratio) is below this gets no gradient."""
    seq_mask_high: Ratio = 2.0
    """A sequence whose geometric-mean ratio is above this gets no gradient."""
    tis_cap: Ratio = 2.0
    """Truncation cap C on the token importance weight min(ratio, C)."""


class M2POOptions(Options):
    """M2PO: a second-moment trust region over the tokens' log-ratios."""

    m2po_tau: Annotated[float, Meta(gt=0)] = 0.04
    """The bound on the mean squared log-ratio of the tokens kept; the largest are masked until it holds (0.04)."""


TOKEN_PG = Plugin(load="streamrl.algo.losses:token_pg", options=PPOOptions)
DECOUPLED_PPO = Plugin(load="streamrl.algo.offpolicy:decoupled_ppo", options=DecoupledPPOOptions)
TIS = Plugin(load="streamrl.algo.offpolicy:tis", options=TISOptions)
MIS = Plugin(load="streamrl.algo.offpolicy:masked_is", options=MISOptions)
ICEPOP = MIS
SEQ_MASK = Plugin(load="streamrl.algo.offpolicy:seq_mask", options=SeqMaskOptions)
M2PO = Plugin(load="streamrl.algo.offpolicy:m2po", options=M2POOptions)
