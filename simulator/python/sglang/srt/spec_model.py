"""Speculative-decoding acceptance and throughput model of the fake server.

Acceptance (documented in simulator/README.md):

* EAGLE family with ``topk == 1`` (EAGLE, EAGLE3, STANDALONE, FROZEN_KV_MTP,
  DFLASH, DSPARK, UNO): a chain of ``k = num_draft_tokens - 1`` draft tokens.
  Each verify step accepts draft token ``i`` with probability ``p`` as long as
  every earlier one was accepted; the target's bonus token is always added.
  Accepted length ``L`` per verify step is 1..k+1 with
  ``E[L] = (1 - p**(k+1)) / (1 - p)`` (bonus included).
* ``topk > 1`` (tree drafts): effective-chain approximation.  The tree of
  ``num_draft_tokens - 1`` nodes spread over ``num_steps`` levels gives on
  average ``b = min(topk, (num_draft_tokens - 1) / num_steps)`` candidates per
  level (at least 1); a level is accepted when any candidate is, with
  ``p_eff = 1 - (1 - p)**b``; the chain length is
  ``k_eff = min(num_steps, num_draft_tokens - 1)``.
* NGRAM: chain of ``num_draft_tokens - 1`` with its own probability
  ``SGLANG_SIM_NGRAM_ACCEPT_P`` (default 0.35).

Throughput: without speculation one decode step yields one token and takes
``1 / base_tps`` (``SGLANG_SIM_BASE_TPS``, default 90 tok/s).  With
speculation one verify step takes
``(verify_cost + draft_token_cost * (num_draft_tokens - 1)) / base_tps``
(``SGLANG_SIM_VERIFY_COST`` = 2.628, ``SGLANG_SIM_DRAFT_TOKEN_COST`` = 0.004,
both in baseline decode steps), calibrated on the incident: steps 1 / topk 1
/ 2 draft tokens -> E[L] = 1.661, 56.8 tok/s; steps 15 / topk 1 / 16 draft
tokens -> E[L] = 2.946, 98.6 tok/s.
"""
from __future__ import annotations

import random

CHAIN_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "FROZEN_KV_MTP", "DFLASH", "DSPARK", "UNO")


class SpecModel:
    """Acceptance/timing model for one resolved configuration."""

    def __init__(self, algorithm, num_steps, topk, num_draft_tokens, knobs):
        self.algorithm = algorithm
        self.base_tps = knobs.base_tps
        self.enabled = algorithm is not None and num_draft_tokens is not None
        self.num_steps = num_steps
        self.topk = topk
        self.num_draft_tokens = num_draft_tokens
        if not self.enabled:
            self.k = 0
            self.p = 0.0
            self.step_cost = 1.0
            return
        draft = max(1, int(num_draft_tokens))
        steps = max(0, int(num_steps if num_steps is not None else draft - 1))
        topk = int(topk) if topk is not None else 1
        if algorithm == "NGRAM":
            self.k = draft - 1
            self.p = knobs.ngram_accept_p
        elif topk <= 1 or steps == 0:
            self.k = draft - 1
            self.p = knobs.accept_p
        else:
            branches = max(1.0, min(float(topk), (draft - 1) / float(steps)))
            self.p = 1.0 - (1.0 - knobs.accept_p) ** branches
            self.k = min(steps, draft - 1)
        self.step_cost = knobs.verify_cost + knobs.draft_token_cost * (draft - 1)

    # ------------------------------------------------------------------
    def expected_accept_length(self) -> float:
        if not self.enabled:
            return 1.0
        if self.p <= 0.0:
            return 1.0
        return (1.0 - self.p ** (self.k + 1)) / (1.0 - self.p)

    def step_seconds(self) -> float:
        """Simulated seconds of one decode (or verify) step."""
        return self.step_cost / self.base_tps

    def expected_tps(self) -> float:
        return self.expected_accept_length() / self.step_seconds() if self.enabled else self.base_tps

    def sample_step(self, rng: random.Random) -> int:
        """Tokens produced by one verify step (accepted drafts + bonus)."""
        n = 1
        for _draft in range(self.k):
            if rng.random() < self.p:
                n += 1
            else:
                break
        return n

    def plan(self, completion_tokens: int, rng: random.Random) -> list:
        """Per-verify-step token counts producing ``completion_tokens`` tokens.

        The last step is truncated at max_new_tokens, as in SGLang (the extra
        accepted tokens are dropped).  Without speculation every step is 1.
        """
        if completion_tokens <= 0:
            return []
        if not self.enabled:
            return [1] * completion_tokens
        out, total = [], 0
        while total < completion_tokens:
            n = min(self.sample_step(rng), completion_tokens - total)
            out.append(n)
            total += n
        return out
