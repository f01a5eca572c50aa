import random

import pytest
import torch

from dart_core.tree import ROW_BY_ROW, TokenTree


def random_tree(rng: random.Random, n: int) -> TokenTree:
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return TokenTree([rng.randrange(100) for _ in range(n)], parents)


def test_parents_must_precede_children():
    with pytest.raises(ValueError, match="parents must come before"):
        TokenTree([5, 6, 7], [-1, 2, 0])
    with pytest.raises(ValueError, match="root"):
        TokenTree([5, 6], [0, 0])
    with pytest.raises(ValueError):
        TokenTree([], [])


def test_depths_paths_and_leaves():
    #      0
    #    1   2
    #   3     4
    #         5
    t = TokenTree([10, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 2, 4])
    assert t.depths == [0, 1, 1, 2, 2, 3]
    assert t.max_depth == 3
    assert t.leaves() == [3, 5]
    assert t.paths() == [[0, 1, 3], [0, 2, 4, 5]]
    assert t.children(0) == [1, 2]
    assert t.path_to(5) == [0, 2, 4, 5]


def test_ancestor_mask_matches_paths():
    rng = random.Random(1)
    # both ways of building it: a row a node up to ROW_BY_ROW nodes, by generations beyond (up to a GPU's largest)
    for size in [1, 2, 8, ROW_BY_ROW, ROW_BY_ROW + 1] + [rng.randrange(1, 300) for _ in range(45)]:
        t = random_tree(rng, size)
        mask = t.ancestor_mask()
        expected = torch.zeros(len(t), len(t), dtype=torch.bool)
        for i in range(len(t)):
            expected[i, t.path_to(i)] = True
        assert torch.equal(mask, expected)
        assert mask.diagonal().all() and mask[:, 0].all()


def test_chain_and_dict_round_trip():
    t = TokenTree.chain(7, [8, 9])
    assert t.parents == [-1, 0, 1] and t.depths == [0, 1, 2]
    assert TokenTree.from_dict(t.to_dict()) == t


def test_a_branch_shares_existing_nodes_and_respects_its_cap():
    tree = TokenTree([9, 1, 2, 3], [-1, 0, 1, 0])          # 9 -> 1 -> 2, 9 -> 3
    grown, added = tree.with_branch([1, 2, 7, 8], max_new=5)
    assert added == [4, 5] and grown.tokens[4:] == [7, 8] and grown.parents[4:] == [2, 4]
    assert [grown.tokens[i] for i in grown.path_to(5)] == [9, 1, 2, 7, 8]
    cut, added = tree.with_branch([3, 4, 5, 6], max_new=2)  # shares node 3, then adds two of three
    assert added == [4, 5] and [cut.tokens[i] for i in cut.path_to(5)] == [9, 3, 4, 5]
    same, added = tree.with_branch([1, 2], max_new=3)       # already there: nothing added
    assert same is tree and added == []
