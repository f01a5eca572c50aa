"""The greedy choice from an output layer's smaller copy (dart_core.greedy_output): always the argmax of the full fp32
layer as our kernel computes it, ties, NaNs and infinities included, from a bf16 or an int8 copy; the bound it rests on
holds; and the verify step that returns it agrees with the logits it replaces."""

from __future__ import annotations

import pytest
import torch

from dart_core.greedy_output import GreedyOutput
from dart_core.setup.calibration import copy_rows, greedy_copy_rows, measure_greedy_copy
from dart_core.machine import few_rows
from dart_core.machine.hardware import detect
from dart_core.setup.tiny_models import tiny_target
from dart_core.tree import TokenTree

HERE = detect()
KERNEL = few_rows.kernel(HERE.kind)
COPIES = [torch.bfloat16, torch.int8]


def kernel_or_why():
    if KERNEL is None:   # no C compiler: the reason is said, and greedy steps take the full layer
        assert few_rows.why_not(HERE.kind) and not HERE.few_rows
    return KERNEL


def near_ties(gen) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight [300, 64] whose rows 10, 11 and 200 are one row (exact ties) and row 12 that row one ulp off; inputs
    that make them the largest logits, and plain random ones."""
    w = torch.randn(300, 64, generator=gen) * 0.1
    w[11] = w[200] = w[10]
    w[12] = torch.nextafter(w[10], torch.full_like(w[10], 1.0))
    x = torch.randn(12, 64, generator=gen)
    x[:4] = w[10] * 50 + torch.randn(4, 64, generator=gen) * 1e-3
    return w, x


@pytest.mark.parametrize("copy", COPIES)
def test_the_choice_is_the_full_layers_argmax(copy):
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(0)
    for weight, x in [near_ties(gen), (torch.randn(1000, 96, generator=gen), torch.randn(9, 96, generator=gen) * 3)]:
        out = GreedyOutput(weight, kernel, copy)
        full = kernel.linear(x, kernel.pack(weight), None)
        candidates = torch.zeros(x.shape[0], dtype=torch.long)
        assert torch.equal(out.choose(x, candidates), full.max(-1).indices)
        assert (candidates >= 1).all() and (candidates <= weight.shape[0]).all()
        for i in range(x.shape[0]):   # a row alone gets what it gets among others
            assert torch.equal(out.choose(x[i:i + 1]), full[i:i + 1].max(-1).indices)
    weight, x = near_ties(gen)
    assert int(GreedyOutput(weight, kernel, copy).choose(x[:1])) in (10, 12)   # the first of the tied rows, or the ulp


def test_a_bf16_layer_chooses_as_its_bf16_product_does():
    """A bf16 model's output layer (its weight read in place): the int8 copy's choice is the argmax of the product
    of the bf16 weights, ties included."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(3)
    weight, x = near_ties(gen)
    weight = weight.bfloat16()
    out = GreedyOutput(weight, kernel, torch.int8)
    assert out.weight.data_ptr() == weight.data_ptr()   # no fp32 copy of a bf16 weight
    full = kernel.linear(x, kernel.pack(weight, torch.bfloat16), None)
    assert torch.equal(out.choose(x), full.max(-1).indices)
    with pytest.raises(ValueError, match="bf16 or int8"):
        GreedyOutput(weight, kernel, torch.float32)


@pytest.mark.parametrize("copy", COPIES)
def test_nans_and_infinities_choose_as_torch_does(copy):
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(200, 32, generator=gen)
    weight[150, 3] = float("nan")
    x = torch.randn(3, 32, generator=gen)
    x[1, 0] = float("inf")
    x[2] = 0.0
    x[2, 3] = 1.0   # reaches the NaN weight
    out = GreedyOutput(weight, kernel, copy)
    full = kernel.linear(x, kernel.pack(weight), None)
    assert torch.equal(out.choose(x), full.max(-1).indices)


@pytest.mark.parametrize("copy", COPIES)
def test_the_bound_holds_for_every_output(copy):
    """|exact - approximate| <= |x|_2 * bound_j: what the choice's exactness rests on."""
    kernel = kernel_or_why()
    if kernel is None:
        return
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(500, 128, generator=gen) * torch.rand(500, 1, generator=gen)
    out = GreedyOutput(weight, kernel, copy)
    x = torch.randn(16, 128, generator=gen) * 10
    exact = kernel.linear(x, kernel.pack(weight), None).double()
    approx = kernel.linear(x, out.approx, None).double()
    limit = x.double().norm(dim=1, keepdim=True) * out.bound.double()
    assert ((exact - approx).abs() <= limit).all()
    assert (out.bound > 0).all() and bool((limit > (exact - approx).abs() * 1.01).any())


def test_a_verify_gives_the_choices_its_logits_give():
    target = tiny_target("llama", seed=5)
    if target.forward_kind != "lean-native":
        return
    assert target.lean.native.greedy is not None
    cache = target.new_cache()
    target.prefill([1, 7, 9, 4, 22], cache)
    tree = TokenTree([4, 8, 9, 30, 31], [-1, 0, 0, 1, 1])
    logits, feats = target.verify(tree, cache, features=True)
    target.rollback(cache, 5)
    choices, same_feats = target.verify(tree, cache, features=True, choices=True)
    assert torch.equal(choices, logits.max(-1).indices) and torch.equal(feats, same_feats)


def test_the_copy_serves_the_rows_where_it_was_never_slower():
    record = {"rows": [1, 4, 8, 16], "full": [0.020, 0.021, 0.023, 0.029], "copy": [0.017, 0.021, 0.024, 0.028]}
    assert copy_rows(record) == 4          # slower at 8: the full layer from there on, whatever 16 said
    assert copy_rows({**record, "copy": [0.021, 0.01, 0.01, 0.01]}) == 0
    assert copy_rows({**record, "copy": record["full"]}) == 16


def test_the_copys_rows_are_measured_and_applied(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_target("llama", seed=6)
    if target.forward_kind != "lean-native":
        assert greedy_copy_rows(target) is None   # no C layer: no copy to measure
        return
    native = target.lean.native
    record = measure_greedy_copy(target, rows=(1, 4), rounds=1)
    assert record["rows"] == [1, 4] and all(t > 0 for t in record["full"] + record["copy"])
    assert native.greedy_rows == native.max_rows             # the measurement leaves the copy as it found it
    rows = greedy_copy_rows(target)
    assert rows in (0, 1, 4, 8, 16, 32, 64) and greedy_copy_rows(target) == rows   # the second read: the cached file
    cache = target.new_cache()
    target.prefill([1, 7, 9, 4, 22], cache)
    tree = TokenTree([4, 8, 9, 30, 31], [-1, 0, 0, 1, 1])
    expected = target.verify(tree, cache)[0].max(-1).indices
    for served in (0, 4, None):   # the full layer, the copy up to 4 rows, the copy everywhere: the same choices
        target.use_greedy_copy(served)
        assert native.greedy_rows == (native.max_rows if served is None else served)
        target.rollback(cache, 5)
        assert torch.equal(target.verify(tree, cache, choices=True)[0], expected)
