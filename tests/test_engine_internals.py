"""Cache editing, context limits, bf16 verification, sampling through the loop, the draft head's files."""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, GraniteConfig

from dart_core import acceptance
from dart_core.acceptance import Acceptance, SamplingConfig, processed_probs
from dart_core.decoding import GenerationConfig, accepted_rows, generate, run
from dart_core.draft_head import DraftCache, DraftHead, DraftHeadError
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter, VanillaProposer
from dart_core.machine.kernels import ONEDNN, ROW_BUCKETS, KernelPlan, shape_key
from dart_core.target import TargetModel
from dart_core.trace import RunSettings, Trace, TraceError
from dart_core.tree import TokenTree
from dart_core import tree_search
from dart_core.tree_search import SearchConfig
from tests.sampling_stats import chi2_pvalue, exact_joint, sample_through_the_loop
from dart_core.setup.tiny_models import OracleDrafter, TargetDrafter, plain_greedy_reference, random_head, tiny_target

CORRECT_SAMPLING_RULE = acceptance._accept_sampling


@pytest.fixture(scope="module")
def llama():
    return tiny_target("llama")


def cache_tensors(cache):
    return [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]


def test_commit_and_rollback_equal_a_fresh_prefill(llama):
    context = [5, 9, 11, 20, 7]
    tree = TokenTree([30, 31, 32, 33, 34, 35], [-1, 0, 0, 1, 2, 4])
    for path in ([0], [0, 1], [0, 2, 4], [0, 2, 4, 5], [0, 1, 3]):
        cache = llama.new_cache()
        llama.prefill(context, cache)
        llama.verify(tree, cache)
        llama.commit(cache, len(context), path)
        fresh = llama.new_cache()
        llama.prefill(context + [tree.tokens[i] for i in path], fresh)
        for (k, v), (fk, fv) in zip(cache_tensors(cache), cache_tensors(fresh)):
            assert k.shape == fk.shape
            assert torch.allclose(k, fk, atol=1e-5) and torch.allclose(v, fv, atol=1e-5)
    cache = llama.new_cache()
    llama.prefill(context, cache)
    llama.rollback(cache, 3)
    fresh = llama.new_cache()
    llama.prefill(context[:3], fresh)
    assert all(torch.allclose(a[0], b[0], atol=1e-6) for a, b in zip(cache_tensors(cache), cache_tensors(fresh)))
    with pytest.raises(ValueError):
        llama.rollback(cache, 10)


def test_tree_verification_equals_separate_chains(llama):
    context = [4, 8, 15, 16, 23, 42]
    tree = TokenTree([50, 51, 52, 53, 54], [-1, 0, 0, 1, 1])
    cache = llama.new_cache()
    llama.prefill(context, cache)
    logits, feats = llama.verify(tree, cache, features=True)
    assert feats.shape == (5, 3 * llama.hidden_size)
    for node in range(len(tree)):
        chain = context + [tree.tokens[i] for i in tree.path_to(node)]
        with torch.inference_mode():
            ref = llama.model(input_ids=torch.tensor([chain]), output_hidden_states=True)
        assert torch.allclose(logits[node], ref.logits[0, -1], atol=1e-4)
        taps = torch.cat([ref.hidden_states[i][0, -1] for i in llama.taps])  # hidden_states[i] = input of layer i
        assert torch.allclose(feats[node], taps, atol=1e-4)


def test_context_limit_stops_cleanly(llama):
    prompt = [3, 4, 5, 6, 7, 8]
    for max_context in (7, 8, 12, 20):
        expected = plain_greedy_reference(llama, prompt, max_context - len(prompt))
        for proposer in (VanillaProposer(), DartProposer(OracleDrafter(llama, 4)),
                         DartProposer(HeadDrafter(random_head(llama), llama))):
            steps = list(generate(llama, proposer, prompt, GenerationConfig(100, max_context=max_context)))
            out = [t for s in steps for t in s.new_tokens]
            assert out == expected and len(prompt) + len(out) == max_context
            assert steps[-1].stop_reason == "context_full"
            assert all(s.context_len + len(s.tree) <= max_context for s in steps[1:])
    with pytest.raises(ValueError, match="context limit"):
        list(generate(llama, VanillaProposer(), prompt, GenerationConfig(5, max_context=6)))


def test_bad_generation_input(llama):
    with pytest.raises(ValueError, match="empty"):
        list(generate(llama, VanillaProposer(), [], GenerationConfig()))
    for n in (0, -3):
        with pytest.raises(ValueError, match="max_new_tokens"):
            list(generate(llama, VanillaProposer(), [5], GenerationConfig(max_new_tokens=n)))
    with pytest.raises(ValueError, match="top_p"):
        list(generate(llama, VanillaProposer(), [5], GenerationConfig(sampling=SamplingConfig(1.0, top_p=1.5))))


def test_bf16_verification_matches_plain_forward():
    """In bf16 a k-token forward rounds differently from k one-token forwards, so exact identity with plain bf16
    decoding is not the contract; the verify logits on the accepted path must match a plain forward over the same
    tokens within bf16 tolerance, and every accepted token must be the argmax of the verify logits."""
    target = tiny_target("llama", dtype=torch.bfloat16, seed=5)
    proposer = DartProposer(OracleDrafter(target, 3), SearchConfig(node_budget=20))
    prompt = [7, 3, 9, 12, 40, 41]
    committed = list(prompt)
    cache_checked = 0
    for step in generate(target, proposer, prompt, GenerationConfig(max_new_tokens=20)):
        if step.kind == "prefill":
            committed.append(step.new_tokens[0])
            continue
        tree = step.tree
        cache = target.new_cache()
        target.prefill(committed[:-1], cache)
        logits, _ = target.verify(tree, cache)
        path_tokens = [tree.tokens[i] for i in step.path]
        with torch.inference_mode():
            plain = target.model(input_ids=torch.tensor([committed[:-1] + path_tokens])).logits[0, -len(path_tokens):]
        assert torch.allclose(logits[step.path].float(), plain.float(), atol=0.15, rtol=0.05)
        argmax = logits.argmax(-1)
        for parent, child in zip(step.path[:-1], step.path[1:]):
            assert int(argmax[parent]) == tree.tokens[child]
        assert int(argmax[step.path[-1]]) == step.new_tokens[-1] or step.stop_reason
        committed.extend(step.new_tokens)
        cache_checked += 1
    assert cache_checked > 2


def test_packed_output_layer_gives_the_models_logits_and_follows_weight_changes():
    target = tiny_target("llama", seed=5)
    assert target.own_output_layer  # CPU, fp32, plain output layer: our forwards apply it, the plan picks its kernel
    target.use_kernels(KernelPlan({shape_key(target.lm_head): [ONEDNN] * len(ROW_BUCKETS)}))
    assert id(target.lm_head) in target.fast_linears.packed
    ids, pos = torch.tensor([3, 9, 4, 7]), torch.arange(4)

    def both():
        with torch.inference_mode():
            ours, _ = target.forward(ids, pos, target.new_cache())
            theirs = target.model(input_ids=ids[None]).logits[0]
        return ours, theirs

    ours, theirs = both()
    assert torch.allclose(ours, theirs, atol=1e-4)
    with torch.no_grad():
        target.lm_head.weight.mul_(-0.5)  # an edit after loading must not leave a stale packed copy
    ours, theirs = both()
    assert torch.allclose(ours, theirs, atol=1e-4)


def test_scaled_logits_keep_the_models_own_output_layer():
    torch.manual_seed(0)
    cfg = GraniteConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, logits_scaling=4.0)
    target = TargetModel(AutoModelForCausalLM.from_config(cfg).eval())
    assert not target.own_output_layer  # logits are not just the output layer: applying it ourselves would be wrong
    ids = torch.tensor([3, 9, 4])
    with torch.inference_mode():
        ours, _ = target.forward(ids, torch.arange(3), target.new_cache())
        theirs = target.model(input_ids=ids[None]).logits[0]
    assert torch.allclose(ours, theirs, atol=1e-5)


def bonus_from_all_of_p(tree, logits, cfg, gen, children):
    """A deliberately wrong sampling rule (the negative control): where every draft below the last accepted node
    was rejected, the bonus token is drawn from the node's whole p, rejected drafts included, instead of from
    what is left of p. Accepted paths are the correct rule's."""
    result = CORRECT_SAMPLING_RULE(tree, logits, cfg, gen, children)
    if children.get(result.path[-1]):
        p = processed_probs(logits[result.path[-1]], cfg).double()
        return Acceptance(result.path, int(torch.multinomial(p, 1, generator=gen)))
    return result


def test_sampling_through_the_loop_matches_the_target_distribution(monkeypatch, one_thread):
    """Five sampled tokens through the whole loop (prefill, then at least two verify steps of tree drafts that are
    often accepted, past cache compactions) against the exact processed target distribution of all five (chi-square,
    fixed seeds); the same test rejects a subtly wrong acceptance rule."""
    target = tiny_target("llama", vocab=16, hidden=32, layers=2, seed=11)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.4)  # soften: several tokens carry real probability
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, top_k=3)
    prompt, n_tokens, n_runs = [3, 5, 7], 5, 600
    joint = exact_joint(target, prompt, sampling, n_tokens)
    assert sum(joint.values()) == pytest.approx(1.0)
    # depth-2 trees (2 x 2 children): a verify step emits at most 3 tokens, so 5 tokens take 2 verify steps or more;
    # 2 drafts per node where the target keeps up to 3 tokens: rejections and leftover bonus draws happen too
    proposer = DartProposer(TargetDrafter(target, n_rows=2), SearchConfig(topk=2, beam_width=2, node_budget=6))
    right = sample_through_the_loop(target, proposer, prompt, sampling, n_tokens, n_runs)
    assert min(right["verify_steps"]) >= 2
    assert right["accepted"] > sum(right["verify_steps"])  # more than one accepted draft per verify step
    assert right["compacted_then_verified"] > n_runs / 4
    assert all(out in joint for out in right["outputs"])  # nothing the target cannot produce
    assert chi2_pvalue(right["outputs"], joint) > 1e-3

    monkeypatch.setattr(acceptance, "_accept_sampling", bonus_from_all_of_p)
    wrong = sample_through_the_loop(target, proposer, prompt, sampling, n_tokens, n_runs)
    assert chi2_pvalue(wrong["outputs"], joint) < 1e-3


def test_draft_head_save_load_round_trip(tmp_path, llama):
    head = random_head(llama, n_mask=2, seed=4)
    head.save(tmp_path / "h")
    loaded = DraftHead.load(tmp_path / "h")
    feats = torch.randn(5, 3 * llama.hidden_size)
    embeds = torch.randn(5, llama.hidden_size)
    w = llama.lm_head.weight
    assert torch.equal(head(feats, embeds, DraftCache(), w), loaded(feats, embeds, DraftCache(), w))
    head.save(tmp_path / "h16", dtype=torch.bfloat16)  # half the file; loads back into fp32 weights
    small = DraftHead.load(tmp_path / "h16")
    assert small.fc.weight.dtype == torch.float32
    assert (tmp_path / "h16" / "model.safetensors").stat().st_size < 0.6 * (tmp_path / "h" / "model.safetensors").stat().st_size
    assert torch.allclose(head(feats, embeds, DraftCache(), w), small(feats, embeds, DraftCache(), w), atol=0.1, rtol=0.05)


def test_training_forward_equals_inference_forward(llama):
    """forward_train's block-masked rows for anchor p equal the inference forward after committing p."""
    head = random_head(llama, n_mask=3, seed=8, draft_vocab_size=40, tie_output=False)
    T = 12
    feats = torch.randn(T, 3 * llama.hidden_size)
    embeds = torch.randn(T, llama.hidden_size)
    anchors = torch.tensor([2, 5, 9, 11])
    with torch.no_grad():
        train_rows = head.forward_train(feats, embeds, anchors)
        for a, p in enumerate(anchors.tolist()):
            cache = DraftCache()
            head(feats[:3], embeds[:3], cache)   # drafting steps as decoding would take them
            if p + 1 > 3:
                rows = head(feats[3:p + 1], embeds[3:p + 1], cache)
            else:
                cache = DraftCache()
                rows = head(feats[:p + 1], embeds[:p + 1], cache)
            assert torch.allclose(train_rows[a], rows, atol=1e-4)


def test_drafter_with_onednn_output_layer_drafts_what_the_head_computes(llama):
    head = random_head(llama, n_mask=3, seed=8, draft_vocab_size=40, tie_output=False)
    drafter = HeadDrafter(head, llama)
    assert drafter.output is not None
    feats, embeds = torch.randn(5, 3 * llama.hidden_size), torch.randn(5, llama.hidden_size)
    with torch.inference_mode():
        fast = head(feats, embeds, DraftCache(), output=drafter.output)
        plain = head(feats, embeds, DraftCache())
    assert torch.allclose(fast, plain, atol=1e-4)


def test_draft_head_file_errors(tmp_path, llama):
    head = random_head(llama, n_mask=2)
    folder = tmp_path / "h"
    head.save(folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(DraftHeadError, match="corrupt or truncated"):
        DraftHead.load(folder)
    head.save(folder)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] += 1
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftHeadError, match="gate_proj.weight.*shape"):
        DraftHead.load(folder)
    config["intermediate_size"] -= 1
    config["tie_output"] = False
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(DraftHeadError, match="lacks weight 'lm_head.weight'"):
        DraftHead.load(folder)
    (folder / "config.json").write_text("{not json")
    with pytest.raises(DraftHeadError, match="not valid JSON"):
        DraftHead.load(folder)
    with pytest.raises(DraftHeadError, match="no config.json"):
        DraftHead.load(tmp_path / "missing")


def test_head_for_another_model_is_refused():
    small = tiny_target("llama", hidden=64, vocab=96)
    other_hidden = tiny_target("llama", hidden=32, vocab=96)
    other_vocab = tiny_target("llama", hidden=64, vocab=80)
    head = random_head(small)
    with pytest.raises(DraftHeadError, match="hidden size 64.*32"):
        HeadDrafter(head, other_hidden)
    with pytest.raises(DraftHeadError, match="vocabulary of 96.*80"):
        HeadDrafter(head, other_vocab)
    deeper = tiny_target("llama", hidden=64, vocab=96, layers=8)
    with pytest.raises(DraftHeadError, match="6-layer"):
        HeadDrafter(head, deeper)


def test_trace_json_round_trip(tmp_path, llama):
    ngram = NGramModel.build([[5, 6, 7, 5, 6, 8]], vocab_size=llama.vocab_size)
    proposer = DartProposer(HeadDrafter(random_head(llama), llama), SearchConfig(node_budget=12), ngram)
    trace = run(llama, proposer, [5, 6, 7, 9], GenerationConfig(max_new_tokens=6),
                settings=RunSettings(model="x", search=SearchConfig(node_budget=12)))
    trace.token_text = {t: f"<{t}>" for t in trace.mentioned_tokens()}
    trace.save(tmp_path / "t.json")
    back = Trace.load(tmp_path / "t.json")
    assert back.output_ids == trace.output_ids and back.settings == trace.settings
    assert back.token_text == trace.token_text
    for a, b in zip(trace.steps, back.steps):
        assert a.tree == b.tree and a.path == b.path and a.new_tokens == b.new_tokens
        if a.candidates is not None:
            assert np.array_equal(a.candidates.token, b.candidates.token)
            assert list(a.candidates.fate) == list(b.candidates.fate)
            assert np.allclose(a.candidates.score, b.candidates.score, atol=1e-5)
            assert np.array_equal(np.isnan(a.candidates.ngram_prob), np.isnan(b.candidates.ngram_prob))
            assert np.allclose(a.rows_probs, b.rows_probs, atol=1e-6)
    (tmp_path / "bad.json").write_text('{"format": "something else"}')
    with pytest.raises(TraceError, match="not a DART Lab trace"):
        Trace.load(tmp_path / "bad.json")
    (tmp_path / "bad2.json").write_text("{")
    with pytest.raises(TraceError, match="not JSON"):
        Trace.load(tmp_path / "bad2.json")


def test_a_steps_pruning_record_is_made_when_read_as_the_search_records_it(llama, monkeypatch):
    ngram = NGramModel.build([[5, 6, 7, 5, 6, 8]], vocab_size=llama.vocab_size)
    config = SearchConfig(node_budget=12)
    made = []
    recorded = tree_search._make_candidates
    monkeypatch.setattr(tree_search, "_make_candidates", lambda *a: made.append(1) or recorded(*a))
    trace = run(llama, DartProposer(HeadDrafter(random_head(llama), llama), config, ngram), [5, 6, 7, 9],
                GenerationConfig(max_new_tokens=6))
    steps = [s for s in trace.steps if s.kind == "verify"]
    assert steps and not made                       # decoding made no record
    for s in steps:
        again = tree_search.search(s.rows_tokens, s.rows_probs, trace.context_at(s.index), config, ngram)
        assert s.candidates.to_dict() == again.candidates.to_dict() and s.candidates is s.candidates
    assert len(made) == 2 * len(steps)              # once per step read (and once per search above), then kept
    unrecorded = run(llama, DartProposer(HeadDrafter(random_head(llama), llama), config, ngram,
                                         record_candidates=False), [5, 6, 7, 9], GenerationConfig(max_new_tokens=6))
    assert all(s.candidates is None for s in unrecorded.steps)


def test_metrics_definitions_and_merge(llama):
    proposer = DartProposer(OracleDrafter(llama, 2), SearchConfig(node_budget=5))
    a = run(llama, proposer, [5, 6, 7], GenerationConfig(max_new_tokens=10))
    b = run(llama, VanillaProposer(), [5, 6, 7], GenerationConfig(max_new_tokens=4))
    ma, mb = (__import__("dart_core.metrics", fromlist=["Metrics"]).Metrics.from_steps(t.steps) for t in (a, b))
    assert ma.new_tokens == 10 and ma.tau == pytest.approx(9 / ma.verify_steps)
    assert ma.tau == pytest.approx(1 + ma.accepted_tokens / ma.verify_steps, abs=1.0 / ma.verify_steps)
    assert ma.acceptance_by_depth[0] >= ma.acceptance_by_depth[1]
    total_steps = ma.verify_steps + mb.verify_steps
    ma.merge(mb)
    assert ma.new_tokens == 14 and ma.verify_steps == total_steps and sum(ma.accepted_hist) == total_steps


def test_the_cache_goes_by_the_keyword_the_models_forward_takes():
    """transformers 5.2x takes `cache=`; 5.17 (the GPU machine's image) takes `past_key_values=` and would swallow
    `cache=` in **kwargs, running every forward without a cache."""
    from dart_core.target import cache_argument

    class Old(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, **kwargs):
            return input_ids

    class New(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None, position_ids=None, cache=None, **kwargs):
            return input_ids

    assert cache_argument(Old()) == "past_key_values" and cache_argument(New()) == "cache"
    target = tiny_target("llama", seed=1)       # whichever transformers is installed: the cache fills
    cache = target.new_cache()
    target.prefill([3, 4, 5, 6], cache)
    assert cache_argument(target.model) == target.cache_kwarg and cache.get_seq_length() == 4


def test_the_accepted_paths_features_are_its_rows_a_chains_without_a_copy():
    rows = torch.arange(24.0).reshape(6, 4)
    for path in ([0], [0, 1, 2], [0, 2, 5], [0, 3]):
        assert torch.equal(accepted_rows(rows, path), rows[path])
    assert accepted_rows(rows, [0, 1]).data_ptr() == rows.data_ptr()   # a chain's path: a view of the first rows
