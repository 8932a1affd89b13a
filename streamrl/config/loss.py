"""The `loss` section: the policy loss and its clipping, KL and entropy terms."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from streamrl.config.base import NonNegFloat, _Section


# Kept by measurement (`streamrl bench staleness`, docs/reference/benchmarks.md, 3 seeds): on reverse 6x5 every
# corrected objective holds >= 0.94 of strict's final-policy reward at lag 8 and 16 (tis, seq_mask, tis_cap 1, a
# clip widened to [0.5, 2], decoupled_ppo with 2 or 4 minibatches) where token_pg keeps 0.89 and 0.53; on the
# chat-dataset example (lr 1e-3, 2-token completions) each of them collapses at lag 8 (0.07-0.34) and only
# token_pg's clip against the behaviour policy holds (1.16; 0.42 at lag 16). No objective meets both targets.
DEFAULT_LOSS = "token_pg"
# Fields that act around the objective (the learner reads them), not knobs it takes.
_AROUND = ("name", "variance_control", "ess_step_rule", "ess_step_floor", "proximal")


class LossConfig(_Section):
    name: str = DEFAULT_LOSS
    """Policy loss from the loss registry: token_pg (PPO clip against the behaviour policy, dual clip for A < 0), or an off-policy objective (streamrl/algo/offpolicy.py): decoupled_ppo (AReaL), tis (truncated IS), mis / icepop (masked IS), seq_mask (sequence geometric-mean masking, then TIS), m2po (second-moment trust region)."""
    clip_low: Annotated[float, Meta(ge=0, lt=1)] = 0.2
    """PPO clip range below 1 for the importance ratio."""
    clip_high: NonNegFloat = 0.2
    """PPO clip range above 1 for the importance ratio."""
    is_cap: Annotated[float, Meta(ge=1)] = 2.0
    """Truncation cap on the importance ratio where PPO clipping does not bound it (A < 0)."""
    kl_coef: NonNegFloat = 0.0
    """Weight of the k3 KL penalty against the initial (reference) policy."""
    entropy_coef: NonNegFloat = 0.0
    """Weight of the entropy bonus."""
    tis_cap: Annotated[float, Meta(ge=1)] = 2.0
    """Truncation cap C on the importance weight min(ratio, C) of tis and seq_mask, and on decoupled_ppo's behaviour weight pi_prox / pi_behaviour."""
    mis_low: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """mis / icepop: a token whose ratio pi_theta / pi_behaviour is below this gets no gradient (IcePop: 0.5)."""
    mis_high: Annotated[float, Meta(ge=1)] = 5.0
    """mis / icepop: a token whose ratio is above this gets no gradient (IcePop: 5)."""
    seq_mask_low: Annotated[float, Meta(ge=0, le=1)] = 0.5
    """seq_mask: a sequence whose geometric-mean ratio exp(mean log ratio) is below this gets no gradient."""
    seq_mask_high: Annotated[float, Meta(ge=1)] = 2.0
    """seq_mask: a sequence whose geometric-mean ratio is above this gets no gradient."""
    m2po_tau: Annotated[float, Meta(gt=0)] = 0.04
    """m2po: the bound on the mean squared log-ratio of the tokens kept; the largest are masked until it holds (the paper's 0.04)."""
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

    def objective_knobs(self) -> dict:
        """The knobs the objectives take (losses.compute): every field but the name and what acts around the loss."""
        return {k: v for k, v in msgspec.structs.asdict(self).items() if k not in _AROUND}

    def __post_init__(self) -> None:
        if self.name == DEFAULT_LOSS:  # registered (a test pins it): no torch import for the check
            return
        from streamrl.registry import LOSSES

        if self.name not in LOSSES:
            raise ValueError(f"name={self.name!r}: {LOSSES.unknown(self.name)}")

