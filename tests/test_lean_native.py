"""The lean forward's C layer (dart_core.lean_native): a verified tree's rows get exactly the logits, bit for bit,
that plain decoding gets for the same prefix, whatever the rows beside them and the threads; a prompt longer than its
rows runs there its rows at a time where that was measured faster, else on torch's operations; and a machine that
cannot build it says why and decodes on torch's operations."""

from __future__ import annotations

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.lean_native import NATIVE_ROWS, Q4_1_ROWS
from dart_core.machine import few_rows
from dart_core.machine.few_rows import Reading
from dart_core.proposers import DartProposer, HeadDrafter, PromptLookupProposer, VanillaProposer
from dart_core.setup import calibration
from dart_core.setup.calibration import (READING_MARGIN, READING_WAYS, PrefillChoice, measure_prefill, measure_q4_1,
                                         measure_reading, q4_1_choice, q4_1_rows_of, prefill_choice, prefill_of,
                                         reading_choice, reading_of)
from dart_core.setup.tiny_models import random_head, random_prompts, tiny_target
from dart_core.tree import TokenTree
from dart_core.tree_search import SearchConfig
from tests.q4_blocks import as_q4_1_model


def native_target(family: str, seed: int = 2, **sizes):
    target = tiny_target(family, seed=seed, **sizes)
    target.use_lean()
    if target.lean.native is None:    # no C compiler here: the reason is said, and torch's operations decode
        assert few_rows.why_not(target.hardware.kind)
        return None
    return target


def plain_logits(target, prompt: list[int], path: list[int]) -> list[torch.Tensor]:
    """The logits after each token of `path`, one forward per token, as plain decoding computes them."""
    cache = target.new_cache()
    target.prefill(prompt, cache)
    out = []
    for i, token in enumerate(path):
        logits, _ = target.forward(torch.tensor([token]), torch.tensor([len(prompt) + i]), cache)
        out.append(logits[0])
    return out


@pytest.mark.parametrize("hidden", [64, 128])
def test_a_trees_rows_get_plain_decodings_bits(hidden):
    """On several threads and on one. The prompt is long enough that the tree's attention runs on the threads (6 rows
    by 4 heads over 105 entries; with 40 entries it ran on one thread, and a share lost by the second thread went
    unseen), plain decoding's one row on one thread; hidden 128 gives heads of 32 columns, two slices on AVX2."""
    for family in ("llama", "qwen2", "qwen3"):
        target = native_target(family, hidden=hidden)
        if target is None:
            return
        prompt = [3 + i * 7 % 90 for i in range(100)]   # keys past many vectors
        # a tree whose node 5 follows the path 0 -> 1 -> 3 -> 5, with siblings in between
        tree = TokenTree([11, 12, 13, 14, 15, 16], [-1, 0, 0, 1, 2, 3])
        path_nodes = [0, 1, 3, 5]
        expected = plain_logits(target, prompt[:-1], [prompt[-1]] + [tree.tokens[i] for i in path_nodes[1:]])
        threads = torch.get_num_threads()
        for n_threads in (threads, 1):
            torch.set_num_threads(n_threads)
            try:
                cache = target.new_cache()
                target.prefill(prompt[:-1], cache)
                rooted = TokenTree([prompt[-1]] + tree.tokens[1:], tree.parents)   # the root: the last prompt token
                logits, _ = target.verify(rooted, cache)
            finally:
                torch.set_num_threads(threads)
            for depth, node in enumerate(path_nodes):
                assert torch.equal(logits[node], expected[depth]), (family, n_threads, node)


def rows_through(monkeypatch, target, method: str) -> list[int]:
    """The rows of each call of the C layer's `method`, as they come."""
    calls = []
    original = getattr(type(target.lean.native), method)
    monkeypatch.setattr(type(target.lean.native), method,
                        lambda self, ids, *a, **k: calls.append(ids.shape[0]) or original(self, ids, *a, **k))
    return calls


def test_unless_measured_otherwise_prefills_take_torchs_operations_and_steps_the_c_layer(monkeypatch):
    target = native_target("llama")
    if target is None:
        return
    calls = rows_through(monkeypatch, target, "forward")
    cache = target.new_cache()
    target.prefill(list(range(NATIVE_ROWS + 5)), cache)
    target.forward(torch.tensor([5]), torch.tensor([NATIVE_ROWS + 5]), cache)
    assert calls == [1]
    assert target.planned_linears() == []   # no second packed copy for the kernel plan


def test_a_long_prompt_in_the_c_layer_gets_the_bits_of_any_split_and_dart_stays_lossless(monkeypatch):
    """A prompt longer than the C layer's rows runs there its rows at a time: every row computed alone, the last
    token's logits, the prompt's features and every cache entry are the bits of the same prompt fed in blocks of 7
    tokens (or one at a time); and DART after such a prompt decodes what plain decoding does."""
    target = native_target("qwen3", seed=5)
    if target is None:
        return
    calls = rows_through(monkeypatch, target, "_layers")
    prompt = [(7 * i) % 90 + 3 for i in range(2 * NATIVE_ROWS + 9)]
    target.use_prefill(None)
    whole = target.new_cache()
    logits, feats = target.prefill(prompt, whole, features=True)
    assert calls == [NATIVE_ROWS, NATIVE_ROWS, 9]
    target.use_prefill(0)                      # none longer than its rows: torch's operations take the prompt
    calls.clear()
    target.prefill(prompt, target.new_cache())
    assert calls == []
    split = target.new_cache()
    parts = [target.forward(torch.tensor(prompt[s: s + 7]), torch.arange(s, min(s + 7, len(prompt))), split,
                            features=True) for s in range(0, len(prompt), 7)]
    assert torch.equal(logits, parts[-1][0][-1]) and torch.equal(feats, torch.cat([f for _, f in parts]))
    n = len(prompt)
    assert whole.length == split.length == n and torch.equal(whole.kv[..., :n, :], split.kv[..., :n, :])
    target.use_prefill(None)
    drafter = HeadDrafter(random_head(target), target)
    for start in (0, 11):
        plain = run(target, VanillaProposer(), prompt[start:], GenerationConfig(max_new_tokens=16)).output_ids
        for proposer in (DartProposer(drafter, SearchConfig(node_budget=10)), PromptLookupProposer()):
            assert run(target, proposer, prompt[start:], GenerationConfig(max_new_tokens=16)).output_ids == plain


def test_a_block_with_its_own_mask_beyond_the_c_layers_rows_is_refused():
    target = native_target("llama")
    if target is None:
        return
    cache = target.new_cache()
    target.prefill([5, 6, 7], cache)
    n = NATIVE_ROWS + 1
    with pytest.raises(ValueError, match="with its own mask"):
        target.lean.native.forward(torch.full((n,), 4), torch.arange(3, 3 + n), cache, torch.ones(n, n).tril().bool(),
                                   (), False)


def test_prompts_go_to_the_c_layer_up_to_where_it_was_measured_faster(tmp_path, monkeypatch):
    record = {"rows": [128, 384], "C layer": [0.08, 0.40], "torch": [0.19, 0.67]}
    assert prefill_of(record) == PrefillChoice(None)                        # faster at every length: any prompt
    assert prefill_of(record | {"C layer": [0.08, 0.70]}) == PrefillChoice(128)
    assert prefill_of(record | {"C layer": [0.20, 0.40]}) == PrefillChoice(0)   # slower at the first: none
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert prefill_choice(tiny_target("llama")) is None   # no C layer (torch's forward): nothing to measure
    target = native_target("llama", seed=3)
    if target is None:
        return
    measured = measure_prefill(target, rows=(70, 90), rounds=1)
    assert measured["rows"] == [70, 90] and all(t > 0 for way in ("C layer", "torch") for t in measured[way])
    assert target.lean.native.prefill_rows == NATIVE_ROWS   # left as it found it
    choice = prefill_choice(target)
    assert choice.rows in (None, 0, 128) and prefill_choice(target) == choice   # read back: the file
    words = {None: "any length", 0: "", 128: "up to 128 tokens"}[choice.rows]
    target.use_prefill(choice.rows)
    assert target.prefill_reach == words
    target.use_lean()                                   # kept when the C layer is made again
    assert target.prefill_reach == words


@pytest.mark.parametrize("tiles", ["off", "stand-in", "avx512-bf16"])
def test_a_bf16_model_computes_in_fp32_on_its_bf16_weights_and_keeps_dart_lossless(tiles):
    """The C layer reads a bf16 model's weights widened exactly and computes in fp32: its logits are those of the fp32
    model holding the same (rounded) weights (up to the rotation, whose frequencies a bf16 model holds in bf16), its
    cache is fp32, a prefill through torch's bf16 operations fills it, and a verified tree's rows still get plain
    decoding's bits. With its products from tiles (their plain-C stand-in, or by AVX512-BF16: its arithmetic written
    out where the build has none) each product's input is rounded to bf16 first: the logits stay near, and the rows'
    bits as plain decoding's."""
    import copy

    from dart_core.target import TargetModel
    base = native_target("llama", seed=4)
    if base is None:
        return
    rounded = copy.deepcopy(base.model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.bfloat16().float())
    half, same = TargetModel(copy.deepcopy(rounded).to(torch.bfloat16)), TargetModel(rounded)
    half.use_lean(tiles=tiles)
    same.use_lean()
    on_tiles = tiles != "off"
    assert half.forward_kind == "lean-native" and half.dtype == torch.bfloat16
    assert half.lean.native.tiles == (tiles if on_tiles else "")
    near = 1e-2 if on_tiles else 1e-3
    prompt = list(range(3, 30))
    caches = [t.new_cache() for t in (half, same)]
    assert caches[0].kv.dtype == torch.float32
    logits = [t.prefill(prompt, c)[0] for t, c in zip((half, same), caches)]   # 27 rows: through the C layer
    assert logits[0].dtype == torch.float32 and torch.allclose(logits[0], logits[1], atol=near)
    assert on_tiles == bool((logits[0] - logits[1]).abs().max() > 1e-4)   # on tiles, the inputs' rounding shows
    step = [t.forward(torch.tensor([7]), torch.tensor([len(prompt)]), c)[0] for t, c in zip((half, same), caches)]
    assert torch.allclose(step[0], step[1], atol=near)
    long_cache = half.new_cache()
    half.prefill(list(range(3, NATIVE_ROWS + 20)), long_cache)   # torch's bf16 prefill into the fp32 cache
    assert long_cache.length == NATIVE_ROWS + 17 and torch.isfinite(long_cache.kv[:, :, :, : long_cache.length]).all()
    tree = TokenTree([prompt[-1], 12, 13, 14], [-1, 0, 0, 1])
    expected = plain_logits(half, prompt[:-1], [prompt[-1], 12, 14])
    cache = half.new_cache()
    half.prefill(prompt[:-1], cache)
    got, _ = half.verify(tree, cache)
    for depth, node in enumerate([0, 1, 3]):
        assert torch.equal(got[node], expected[depth])


@pytest.mark.parametrize("family, tiles", [("llama", "stand-in"), ("qwen3", "avx512-bf16")])
def test_dart_on_a_bf16_models_tiles_decodes_as_plain_bf16_decoding(family, tiles):
    """A bf16 model's products from tiles (by the stand-in, or by AVX512-BF16: its arithmetic written out where the
    build has none): DART, with trees of every size up to the budget, and the lookup branch, emit what plain decoding
    of the same bf16 model emits."""
    target = tiny_target(family, seed=7, dtype=torch.bfloat16)
    target.use_lean(tiles=tiles)
    if target.lean.native is None:
        assert few_rows.why_not(target.hardware.kind)
        return
    assert target.lean.native.tiles == tiles
    proposers = [DartProposer(HeadDrafter(random_head(target), target), SearchConfig(node_budget=12)),
                 PromptLookupProposer()]
    for prompt in random_prompts(5, target.vocab_size, seed=8):
        plain = run(target, VanillaProposer(), prompt, GenerationConfig(max_new_tokens=20)).output_ids
        for proposer in proposers:
            assert run(target, proposer, prompt, GenerationConfig(max_new_tokens=20)).output_ids == plain, proposer.name


def test_the_reading_prefetches_from_where_the_hardware_never_won_by_its_margin():
    record = {"rows": [1, 2, 4, 8], "ahead": [1.1, 1.0, 1.0, 1.0], "hardware": [1.0, 1.0, 1.05, 1.2]}
    assert reading_of(record) == Reading(2)                                 # a tie goes to prefetching, as before
    assert reading_of(record | {"ahead": [0.9, 0.9, 0.9, 0.9]}) == Reading(1)
    assert reading_of(record | {"ahead": [1.04, 1.0, 1.0, 1.0]}) == Reading(1)   # the hardware 4% faster: not enough
    assert reading_of(record | {"ahead": [0.9, 0.9, 1.2, 1.0]}) == Reading(8)  # slower at 4: from 8, not from 1
    assert reading_of(record | {"ahead": [2.0, 2.0, 2.0, 2.0]}) == Reading(9)  # never: none of the one-pass products
    assert reading_of(record | {"one stream": [0.5, 0.5, 0.5, 0.5]}) == Reading(2)   # an older record's third way


def test_the_reading_is_measured_applied_and_changes_no_bit(tmp_path, monkeypatch):
    """How the products read the weights (prefetching ahead or not) is a matter of speed only:
    measured once per machine and model (cached), applied to the C layer, kept when the C layer is made again, and a
    verified tree's logits and a one-row step's are the same bits every way."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_target("llama", seed=6)
    if target.forward_kind != "lean-native":
        assert reading_choice(target) is None and target.reading is None   # no C layer: nothing to measure
        return
    record = measure_reading(target, rows=(1, 4, 8), rounds=1)
    timed = record["rows"]
    assert timed == [1, 4, 8][-len(timed):] and all(t > 0 for way in READING_WAYS for t in record[way])
    # from the largest size down to the first at which the hardware won by the margin, none below it
    won = [ahead > hardware * READING_MARGIN for ahead, hardware in zip(record["ahead"], record["hardware"])]
    assert not any(won[1:]) and (won[0] or len(timed) == 3)
    assert target.reading == Reading()   # left as it found it
    reading = reading_choice(target)
    assert reading.prefetch_from in (1, 2, 4, 8, 9) and reading_choice(target) == reading   # read back: the file
    cache = target.new_cache()
    target.prefill([1, 7, 9, 4, 22], cache)
    tree, step = TokenTree([4, 8, 9, 30, 31], [-1, 0, 0, 1, 1]), TokenTree([4], [-1])
    logits = []
    for way in [Reading(1), Reading(3), Reading(9)]:
        target.use_reading(way)
        assert target.lean.native.reading == way
        target.rollback(cache, 5)
        logits.append((target.verify(tree, cache)[0], target.verify(step, cache)[0]))
        target.rollback(cache, 5)
    assert all(torch.equal(x, logits[0][0]) and torch.equal(y, logits[0][1]) for x, y in logits)
    target.use_lean()
    assert target.reading == Reading(9)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_a_model_of_q4_1_blocks_is_read_as_such_with_the_same_bits_and_dart_stays_lossless(family):
    """A model whose decoder weights are Q4_1 blocks (as the default model's, dequantized from its Q4_1 file): steps
    of up to Q4_1_ROWS rows read the blocks, and a verified tree and a prompt get the bits the fp32 packing gives;
    DART decodes what plain decoding does. A model of other weights is read in fp32 alone."""
    target = tiny_target(family, seed=3)
    as_q4_1_model(target)
    target.use_lean()
    native = target.lean.native
    if native is None:
        assert few_rows.why_not(target.hardware.kind)
        return
    assert native.q4_layers is not None and native.q4_rows == Q4_1_ROWS
    prompt = [(5 * i) % 90 + 3 for i in range(40)]
    tree = TokenTree([prompt[-1], 12, 13, 14, 15, 16], [-1, 0, 0, 1, 2, 3])

    def verified(q4_rows: int):
        native.q4_rows = q4_rows
        cache = target.new_cache()
        first, _ = target.prefill(prompt[:-1], cache)
        logits, _ = target.verify(tree, cache)
        return first, logits

    blocks, fp32 = verified(Q4_1_ROWS), verified(0)
    assert torch.equal(blocks[0], fp32[0]) and torch.equal(blocks[1], fp32[1])
    native.q4_rows = Q4_1_ROWS
    plain = run(target, VanillaProposer(), prompt, GenerationConfig(max_new_tokens=24)).output_ids
    drafter = HeadDrafter(random_head(target), target)
    assert run(target, DartProposer(drafter, SearchConfig(node_budget=10)), prompt,
               GenerationConfig(max_new_tokens=24)).output_ids == plain
    other = native_target(family, seed=3)
    assert other.lean.native.q4_layers is None and other.lean.native.q4_rows == 0


def test_the_q4_1_blocks_serve_the_rows_where_they_were_never_slower():
    record = {"rows": [1, 4, 8, 16], "fp32": [2.0, 2.2, 2.6, 3.5], "blocks": [1.0, 1.5, 2.6, 4.0]}
    assert q4_1_rows_of(record) == 8                                         # a tie goes to the blocks
    assert q4_1_rows_of(record | {"blocks": [2.1, 1.0, 1.0, 1.0]}) == 0     # slower at one row: never
    assert q4_1_rows_of(record | {"blocks": [1.0, 3.0, 1.0, 1.0]}) == 1     # slower at 4: not from 8 on either
    assert q4_1_rows_of(record | {"blocks": [1.0, 1.0, 1.0, 1.0]}) == 16


def test_where_the_q4_1_blocks_are_read_is_measured_cached_and_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    target = tiny_target("qwen3", seed=4)
    assert q4_1_choice(target) is None      # weights that are not Q4_1 blocks (or no C layer): nothing to measure
    as_q4_1_model(target)
    target.use_lean()
    if target.forward_kind != "lean-native":
        assert q4_1_choice(target) is None and target.q4_1_rows == 0
        return
    assert target.q4_1_rows == Q4_1_ROWS
    record = measure_q4_1(target, rows=(1, 4, 8), rounds=1)
    timed = record["rows"]
    assert timed == [1, 4, 8][:len(timed)] and all(t > 0 for way in ("fp32", "blocks") for t in record[way])
    slower = [b > f for f, b in zip(record["fp32"], record["blocks"])]   # timed up to the first size where slower
    assert not any(slower[:-1]) and (slower[-1] or len(timed) == 3)
    assert target.q4_1_rows == Q4_1_ROWS    # left as it found it
    rows = q4_1_choice(target)
    assert rows in (0, *calibration.Q4_1_ROWS) and q4_1_choice(target) == rows   # read back: the file
    target.use_q4_1(4)
    target.use_lean()                       # the C layer made again keeps what was measured
    assert target.q4_1_rows == 4 and target.lean.native.q4_rows == 4
    target.use_q4_1(0)
    assert target.q4_1_rows == 0
