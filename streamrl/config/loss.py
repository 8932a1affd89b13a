"""The `loss` section: the objective, and what every objective shares (KL and entropy terms, how token losses add
up, what acts around it); each objective's own keys (clip ranges, caps) are parsed by its Struct (algo.loss_specs)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from streamrl.config.base import NonNegFloat
from streamrl.config.plugged import PluginSection
from streamrl.registry import LOSSES


# Kept by measurement (`streamrl bench staleness`, docs/reference/benchmarks.md: 3 tasks x 2 drift regimes, 3 seeds):
# tis holds >= 0.97 of strict's final-policy reward up to lag 64 on reverse and copy-long at low drift, but collapses
# on the chat-dataset example (lr 1e-3) from lag 1 (0.38 of strict at lag 2), where token_pg's clip against the
# behaviour policy holds (1.24); token_pg keeps only 0.34-0.62 at lag 16. No objective meets the targets everywhere,
# and a default must be safe at the default max_staleness.
DEFAULT_LOSS = "token_pg"
# Fields that act around the objective (the learner reads them), not knobs it takes.
_AROUND = ("name", "variance_control", "ess_step_rule", "ess_step_floor", "proximal")


class LossConfig(PluginSection):
    SELECTORS = (("name", LOSSES),)
    SECTION = "loss"

    name: str = DEFAULT_LOSS
    """Policy loss from the loss registry: token_pg (PPO clip against the behaviour policy, dual clip for A < 0), or an off-policy objective (streamrl/algo/offpolicy.py): decoupled_ppo (AReaL), tis (truncated IS), mis / icepop (masked IS), seq_mask (sequence geometric-mean masking, then TIS), m2po (second-moment trust region)."""
    kl_coef: NonNegFloat = 0.0
    """Weight of the k3 KL penalty against the initial (reference) policy."""
    entropy_coef: NonNegFloat = 0.0
    """Weight of the entropy bonus."""
    aggregation: Literal["token", "sequence"] = "token"
    """How token losses add up: token (mean over the batch's tokens, DAPO) or sequence (mean per sequence, then over sequences: GRPO, MGRPO)."""
    variance_control: Literal["none", "ess_step", "mvb", "both"] = "none"
    """VCPO around any objective: ess_step (lr × sqrt ESS), mvb (off-policy min-variance baseline), both."""
    ess_step_rule: Literal["sqrt", "linear"] = "sqrt"
    """ess_step: the lr multiplier, sqrt(ESS/N) (VCPO's rule for AdamW) or ESS/N."""
    ess_step_floor: Annotated[float, Meta(ge=0, le=1)] = 0.0
    """ess_step: the smallest lr multiplier (VCPO: none, 0)."""
    proximal: Literal["forward", "interpolate"] = "forward"
    """decoupled_ppo, learner.minibatches > 1: proximal log-probs by a forward pass, or interpolated (A-3PO)."""
    opts: dict[str, Any] = {}
    """The objective's own options, parsed by its Struct from this section's other keys (shown under loss below)."""

    def objective_knobs(self) -> dict:
        """The knobs the objective takes (losses.compute): its own options and the terms every objective adds."""
        shared = {k: v for k, v in msgspec.structs.asdict(self).items() if k not in _AROUND and k != "opts"}
        return {**shared, **self.options_dict(LOSSES)}

    def __post_init__(self) -> None:
        if self.name not in LOSSES:
            raise ValueError(f"name={self.name!r}: {LOSSES.unknown(self.name)}")
        super().__post_init__()
