import random

from dart_core.lookup_index import LookupIndex
from dart_core.proposers import PromptLookupProposer


def test_the_index_finds_what_a_scan_of_each_context_finds_as_a_decode_extends_it():
    rng = random.Random(3)
    for min_ngram, max_ngram, num_tokens in ((1, 3, 10), (2, 4, 5), (1, 1, 3)):
        scan = PromptLookupProposer(max_ngram=max_ngram, num_tokens=num_tokens, min_ngram=min_ngram)
        index = LookupIndex(min_ngram, max_ngram, num_tokens)
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]   # a small vocabulary: many repeats
        found = 0
        while len(context) < 400:
            got = index.lookup(context)
            assert got == scan.lookup(context), (len(context), min_ngram, max_ngram)
            found += bool(got)
            context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 5))]   # a step's accepted tokens
        assert found > 50


def test_a_context_that_does_not_extend_the_last_is_indexed_anew():
    scan, index = PromptLookupProposer(3, 10), LookupIndex(1, 3, 10)
    first = [1, 2, 3, 4, 1, 2, 3, 9, 9, 1, 2]
    assert index.lookup(first) == scan.lookup(first) == [3, 9, 9, 1, 2]
    for other in ([5, 6, 7, 5, 6, 7, 8, 5, 6], [1, 2, 3, 4, 1, 2, 3, 9, 7, 1, 2, 3], [1, 2, 3]):
        assert index.lookup(first) == [3, 9, 9, 1, 2]
        assert index.lookup(other) == scan.lookup(other)   # after `first`: unrelated, changed in its tail, shorter


def test_decoding_looks_up_from_a_fresh_index_each_prompt():
    pld = PromptLookupProposer(3, 10)
    first = [4, 5, 6, 4, 5]
    assert pld.propose(first, None, 10).tree.tokens == [5, 6, 4, 5]
    pld.reset()
    assert pld.index.tokens == []
    second = [7, 8, 7]
    assert pld.propose(second, None, 10).tree.tokens == [7, 8, 7]
