import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

from dart_core.acceptance import SamplingConfig, accept, greedy_ids, processed_probs
from dart_core.tree import TokenTree


@pytest.mark.parametrize("t,p,k", [(0.7, 1.0, 0), (1.0, 0.8, 0), (0.5, 0.9, 5), (1.3, 1.0, 3), (0.9, 0.5, 2)])
def test_processing_matches_transformers(t, p, k):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0)) * 3
    scores = TemperatureLogitsWarper(t)(None, logits.clone())
    if k:
        scores = TopKLogitsWarper(k)(None, scores)
    if p < 1:
        scores = TopPLogitsWarper(p)(None, scores)
    expected = scores.softmax(-1)
    got = processed_probs(logits, SamplingConfig(temperature=t, top_p=p, top_k=k))
    assert torch.allclose(got, expected, atol=1e-6)


def test_greedy_walks_the_argmax_path():
    #   0 -> 1(tok 5) -> 3(tok 7)
    #   0 -> 2(tok 6) -> 4(tok 8)
    tree = TokenTree([9, 5, 6, 7, 8], [-1, 0, 0, 1, 2])
    logits = torch.zeros(5, 12)
    logits[0, 6] = logits[2, 8] = logits[4, 11] = 1.0  # root->6 matches node 2, then 8 (node 4), then 11
    logits[1, 7] = logits[3, 1] = 1.0
    res = accept(tree, logits, SamplingConfig())
    assert res.path == [0, 2, 4] and res.bonus == 11 and res.accepted == 2
    logits[0] = 0
    logits[0, 3] = 1.0  # nothing matches at the root: only the bonus token
    res = accept(tree, logits, SamplingConfig())
    assert res.path == [0] and res.bonus == 3


def test_greedy_ids_are_torchs_argmax_ties_included():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(0, 4, (64, 300), generator=gen).float()    # every row has many equal maxima
    logits[3] = 0.0
    assert torch.equal(greedy_ids(logits), logits.argmax(-1))
    assert int(greedy_ids(logits[5])) == int(logits[5].argmax())
    # fp32 logits take our C scan where it is built; other dtypes take torch's max on every machine: both ways here
    for other in (logits.double(), logits.bfloat16()):
        assert torch.equal(greedy_ids(other), logits.argmax(-1))


def test_sampling_emits_the_target_distribution():
    """First and second emitted tokens follow the processed target distribution exactly (chi-square, fixed seed)."""
    vocab = 6
    gen = torch.Generator().manual_seed(123)
    logits = torch.randn(4, vocab, generator=gen) * 1.5
    # root has three draft children (tokens 0, 1, 2); child 0 has one child (token 3)
    tree = TokenTree([5, 0, 1, 2, 3], [-1, 0, 0, 0, 1])
    node_logits = torch.stack([logits[0], logits[1], logits[2], logits[3], logits[1]])
    cfg = SamplingConfig(temperature=0.8, top_p=0.95, top_k=5, seed=7)
    probs = processed_probs(node_logits, cfg).double().numpy()
    rng = cfg.make_generator()
    n = 6000
    first = np.zeros(vocab)
    second_after_0 = np.zeros(vocab)
    for _ in range(n):
        res = accept(tree, node_logits, cfg, rng)
        emitted = [tree.tokens[i] for i in res.path[1:]] + [res.bonus]
        first[emitted[0]] += 1
        if emitted[0] == 0:
            second_after_0[emitted[1]] += 1
    support = probs[0] > 0
    assert first[~support].sum() == 0
    expected = probs[0][support] / probs[0][support].sum() * n
    assert chisquare(first[support], expected).pvalue > 1e-3
    p1 = probs[1]
    s1 = p1 > 0
    assert chisquare(second_after_0[s1], p1[s1] / p1[s1].sum() * second_after_0.sum()).pvalue > 1e-3


def test_bad_sampling_settings():
    for kwargs, name in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"), ({"top_k": -2}, "top_k")]:
        with pytest.raises(ValueError, match=name):
            SamplingConfig(**kwargs).validate()
