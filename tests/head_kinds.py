"""Every kind of draft head a drafting step must serve, as random heads: the C layer's tests
(test_draft_native.py) and the fixed-shape drafting step's (test_draft_fixed.py) run each."""

from __future__ import annotations

import torch

from dart_core.setup.tiny_models import random_head

# a head with its own output layer, one tied to the target's, and one with standardized features, a double norm and
# a draft vocabulary
HEAD_KINDS = [dict(tie_output=False), dict(tie_output=True),
              dict(tie_output=False, standardize_features=True, double_norm=True, draft_vocab_size=50)]


def head_of_kind(target, overrides: dict):
    """A random head of that kind, its feature statistics (where it standardizes) away from the identity."""
    head = random_head(target, n_mask=3, seed=5, **overrides)
    if head.config.standardize_features:
        with torch.no_grad():
            head.feature_mean.normal_(0, 0.5)
            head.feature_std.uniform_(0.5, 2.0)
    return head
