"""Draft heads in the DART authors' format: they draft the rows the authors' forward computes, decode losslessly on
a Qwen3 target (greedy and sampled), and bad folders are refused with a message naming the problem."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from dart_core.acceptance import SamplingConfig
from dart_core.decoding import GenerationConfig, run
from dart_core.draft_head import DraftHeadError
from dart_core.draft_head import DraftConfig, DraftHead
from dart_core.formats.head_formats import AUTHORS, head_format, load_head, save_authors
from dart_core.ngram import NGramModel
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.setup.loading import load_draft
from dart_core.setup.tiny_models import plain_greedy_reference, tiny_target
from dart_core.tree_search import SearchConfig
from tests.authors_format import THEIR_KEYS, read_authors_head, their_draft, their_features, write_authors_head
from tests.sampling_stats import chi2_pvalue, exact_joint, sample_through_the_loop
from dart_core.setup.tiny_models import random_prompts as prompts


@pytest.fixture(scope="module")
def qwen3():
    # 8 layers: their taps 2, N//2, N-3 are three distinct layers (below 7 their code keeps fewer than its fc takes)
    return tiny_target("qwen3", vocab=96, hidden=64, layers=8, seed=5)


@pytest.fixture
def written(tmp_path, qwen3):
    return tmp_path / "head", write_authors_head(tmp_path / "head", qwen3, draft_length=3, draft_vocab=64, seed=2)


def test_the_head_drafts_the_rows_their_forward_computes(qwen3, written):
    folder, theirs = written
    assert head_format(folder) == AUTHORS
    head = load_draft(str(folder), qwen3)
    assert head.config.n_rows == 4 and head.config.double_norm
    drafter = HeadDrafter(head, qwen3)
    prompt, root = [5, 17, 33, 8, 61, 12, 40], 9
    feats = their_features(qwen3, prompt)
    _, ours_feats = qwen3.prefill(prompt, qwen3.new_cache(), features=True)
    assert torch.allclose(ours_feats, feats, atol=1e-5)  # the same taps, in the same order

    # right after prefill: the prompt's features with the embeddings of prompt[1:] and the first generated token
    embeds = qwen3.embed_tokens(torch.tensor(prompt[1:] + [root]))
    want, target_ids, past = their_draft(theirs, feats, embeds)
    got = drafter.draft(prompt + [root], ours_feats)
    assert got.shape == want.shape == (4, 64)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.equal(drafter.target_ids(torch.arange(64)), target_ids)

    # a later step: three committed tokens (root and two accepted), with the draft cache of the first call
    accepted, nxt = [22, 3], 70
    full = prompt + [root] + accepted
    new_feats = their_features(qwen3, full)[len(prompt):]
    embeds = qwen3.embed_tokens(torch.tensor(accepted + [nxt]))
    want, _, _ = their_draft(theirs, new_feats, embeds, past)
    got = drafter.draft(full + [nxt], new_feats)
    assert torch.allclose(got, want, atol=1e-4)


def test_an_embedding_in_the_file_is_not_read(tmp_path, qwen3):
    plain = write_authors_head(tmp_path / "a", qwen3, seed=4)
    write_authors_head(tmp_path / "b", qwen3, seed=4, with_embedding=True)
    feats = their_features(qwen3, [4, 5, 6])
    embeds = qwen3.embed_tokens(torch.tensor([5, 6, 7]))
    want, _, _ = their_draft(plain, feats, embeds)
    for folder in ("a", "b"):
        got = HeadDrafter(load_draft(str(tmp_path / folder), qwen3), qwen3).draft([4, 5, 6, 7], feats)
        assert torch.allclose(got, want, atol=1e-4)


def _drafts_like_theirs(folder, written, target, prompt=(4, 5, 6, 9, 30), root=7):
    feats = their_features(target, list(prompt))
    embeds = target.embed_tokens(torch.tensor(list(prompt[1:]) + [root]))
    want, want_ids, _ = their_draft(written, feats, embeds)
    drafter = HeadDrafter(load_draft(str(folder), target), target)
    got = drafter.draft(list(prompt) + [root], feats)
    assert torch.allclose(got, want, atol=1e-4)
    assert torch.equal(drafter.target_ids(torch.arange(want.shape[1])), want_ids)
    return drafter.head


def test_absent_config_fields_take_their_defaults(tmp_path, qwen3):
    """Set: the file's values are used (rope_theta, rms_norm_eps, num_key_value_heads, head_dim). Absent: their
    config class's defaults (10000, 1e-6, the number of heads, hidden // heads), not the target's."""
    folder = tmp_path / "h"
    written = write_authors_head(folder, qwen3, kv_heads=4, rope_theta=500000.0, rms_norm_eps=1e-5, seed=6)
    head = _drafts_like_theirs(folder, written, qwen3)
    assert (head.config.rope_theta, head.config.rms_eps, head.config.num_kv_heads) == (500000.0, 1e-5, 4)
    dropped = ("rope_theta", "rms_norm_eps", "num_key_value_heads", "head_dim", "hidden_act", "rope_scaling",
               "max_position_embeddings", "target_hidden_size", "torch_dtype")
    _edit_config(folder, **dict.fromkeys(dropped))
    for key in dropped:
        written["config"].pop(key)
    head = _drafts_like_theirs(folder, written, qwen3)
    assert (head.config.rope_theta, head.config.rms_eps, head.config.num_kv_heads) == (10000.0, 1e-6, 4)
    assert head.config.head_dim == 64 // 4


def test_a_file_without_d2t_maps_draft_ids_to_themselves(tmp_path, qwen3):
    """Their weights load with strict=False: without d2t the zero buffer stays, offsets 0."""
    folder = tmp_path / "h"
    written = write_authors_head(folder, qwen3, draft_vocab=64, seed=8)
    _edit_weights(folder, drop=["d2t", "t2d"])
    del written["state"]["d2t"], written["state"]["t2d"]
    head = _drafts_like_theirs(folder, written, qwen3)
    assert torch.equal(head.d2t, torch.arange(64))


def test_greedy_decoding_with_their_head_is_lossless(qwen3, written):
    folder, _ = written
    head = load_draft(str(folder), qwen3)
    table = NGramModel.build(prompts(40, qwen3.vocab_size, seed=3), vocab_size=qwen3.vocab_size, order=3)
    for config in (SearchConfig(), SearchConfig(node_budget=40, beam_width=12)):
        proposer = DartProposer(HeadDrafter(head, qwen3), config, table)
        for prompt in prompts(8, qwen3.vocab_size, seed=6):
            expected = plain_greedy_reference(qwen3, prompt, 20)
            trace = run(qwen3, proposer, prompt, GenerationConfig(max_new_tokens=20))
            assert trace.output_ids == expected
            assert all(len(s.tree) - 1 <= config.node_budget for s in trace.steps[1:])


def test_sampling_with_their_head_matches_the_target_distribution(tmp_path, one_thread):
    target = tiny_target("qwen3", vocab=8, hidden=32, layers=4, seed=11)
    with torch.no_grad():
        target.lm_head.weight.mul_(0.4)  # several tokens carry real probability
    write_authors_head(tmp_path / "h", target, draft_length=1, draft_vocab=6, seed=3)
    head = load_draft(str(tmp_path / "h"), target)
    sampling = SamplingConfig(temperature=1.0, top_p=0.95, top_k=3)
    prompt, n_tokens, n_runs = [3, 5, 7], 4, 500
    joint = exact_joint(target, prompt, sampling, n_tokens)
    proposer = DartProposer(HeadDrafter(head, target), SearchConfig(topk=3, beam_width=3, node_budget=6))
    stats = sample_through_the_loop(target, proposer, prompt, sampling, n_tokens, n_runs)
    assert stats["accepted"] > n_runs / 4  # the head's drafts are accepted often enough to matter
    assert all(out in joint for out in stats["outputs"])
    pvalue = chi2_pvalue(stats["outputs"], joint)
    print(f"authors' head, sampling: {stats['accepted']} drafts accepted in {n_runs} runs, chi-square p = {pvalue:.3f}")
    assert pvalue > 1e-3


def _edit_config(folder, **changes):
    path = folder / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _edit_weights(folder, drop=(), **replace):
    path = folder / "model.safetensors"
    state = load_file(str(path))
    for key in drop:
        state.pop(key)
    state.update(replace)
    save_file(state, str(path))


def test_bad_folders_are_refused_with_the_reason(tmp_path, qwen3, written):
    folder, theirs = written
    with pytest.raises(DraftHeadError, match="lacks draft_vocab_size"):
        _edit_config(folder, draft_vocab_size=None)
        load_head(folder)
    _edit_config(folder, draft_vocab_size=64, hidden_size=None, target_hidden_size=None)
    with pytest.raises(DraftHeadError, match=r"'midlayer.mask_rep' has shape \(128,\), the config needs \(8192,\)"):
        load_head(folder)   # absent, hidden_size is their default 4096, which these weights do not have
    _edit_config(folder, hidden_size=64, target_hidden_size=64)

    with pytest.raises(DraftHeadError, match="lacks weight 'midlayer.mlp.up_proj.weight'"):
        _edit_weights(folder, drop=["midlayer.mlp.up_proj.weight"])
        load_head(folder)
    _edit_weights(folder, **{"midlayer.mlp.up_proj.weight": theirs["state"]["midlayer.mlp.up_proj.weight"],
                             "midlayer.mask_rep": torch.zeros(10)})
    with pytest.raises(DraftHeadError, match=r"'midlayer.mask_rep' has shape \(10,\)"):
        load_head(folder)
    _edit_weights(folder, **{"midlayer.mask_rep": theirs["state"]["midlayer.mask_rep"],
                             "d2t": theirs["state"]["d2t"] + 1000})
    with pytest.raises(DraftHeadError, match="outside the target vocabulary"):
        load_head(folder)
    _edit_weights(folder, d2t=theirs["state"]["d2t"])
    load_head(folder)  # whole again

    _edit_config(folder, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(DraftHeadError, match="rope_scaling 'yarn' is not supported"):
        load_head(folder)
    _edit_config(folder, rope_scaling=None, target_hidden_size=128)
    with pytest.raises(DraftHeadError, match="target_hidden_size 128 differs"):
        load_head(folder)
    _edit_config(folder, target_hidden_size=None, draft_length=None)
    with pytest.raises(DraftHeadError, match="neither 'format'.*nor 'draft_length'"):
        load_head(folder)
    with pytest.raises(DraftHeadError, match="not a folder"):
        load_head(tmp_path / "nowhere")


def test_a_head_for_another_target_is_refused(tmp_path, qwen3):
    wide = tiny_target("qwen3", vocab=96, hidden=32, layers=6)
    write_authors_head(tmp_path / "h", wide)
    with pytest.raises(DraftHeadError, match="hidden size 32, the target has 64"):
        load_draft(str(tmp_path / "h"), qwen3)


def test_the_writer_gives_back_the_files_written_by_hand(tmp_path, qwen3, written):
    """Read a head written by the independent writer, write it with save_authors: the same weights under the same
    keys, d2t as the same offsets, t2d the same, and every config field their model reads the same."""
    folder, theirs = written
    save_authors(load_head(folder), tmp_path / "again", max_positions=2048)
    again = read_authors_head(tmp_path / "again")
    assert set(again["state"]) == THEIR_KEYS == set(theirs["state"])
    for key, tensor in theirs["state"].items():
        assert again["state"][key].dtype == tensor.dtype and torch.equal(again["state"][key], tensor), key
    for key, value in theirs["config"].items():
        assert again["config"][key] == value, key


def _trained_style_head(target, seed=4):
    """A head as --format authors trains it: double norm, its own output layer over a draft vocabulary, features
    scaled per dimension (no mean)."""
    cfg = DraftConfig.for_target(target.config, n_mask=3, tie_output=False, draft_vocab_size=48,
                                 standardize_features=True, double_norm=True)
    head = DraftHead.random(cfg, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        head.d2t.copy_(torch.randperm(target.vocab_size, generator=gen)[:48].sort().values)
        head.feature_std.copy_(torch.rand(3 * target.hidden_size, generator=gen) * 3 + 0.1)
        head.final_norm.weight.copy_(1 + 0.3 * torch.randn(target.hidden_size, generator=gen))
    return head


def test_a_head_written_in_their_format_drafts_in_their_forward_what_it_drafted_here(tmp_path, qwen3):
    head = _trained_style_head(qwen3)
    save_authors(head, tmp_path / "h")
    theirs = read_authors_head(tmp_path / "h")
    assert set(theirs["state"]) == THEIR_KEYS and "embed_tokens.weight" not in theirs["state"]
    assert theirs["config"]["draft_length"] == 3 and theirs["config"]["draft_vocab_size"] == 48
    prompt, root = [5, 17, 33, 8, 61, 12, 40], 9
    feats = their_features(qwen3, prompt)
    embeds = qwen3.embed_tokens(torch.tensor(prompt[1:] + [root]))
    want, target_ids, past = their_draft(theirs, feats, embeds)
    for drafter in (HeadDrafter(head, qwen3), HeadDrafter(load_draft(str(tmp_path / "h"), qwen3), qwen3)):
        got = drafter.draft(prompt + [root], feats)  # the head in memory, and read back by our loader
        assert torch.allclose(got, want, atol=1e-4)
        assert torch.equal(drafter.target_ids(torch.arange(48)), target_ids)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert torch.equal(theirs["state"]["t2d"].nonzero()[:, 0], head.d2t)


def test_heads_their_forward_cannot_compute_exactly_are_not_written(tmp_path, qwen3):
    single = _trained_style_head(qwen3)
    single.config.double_norm = False
    with pytest.raises(DraftHeadError, match="applies its final norm once"):
        save_authors(single, tmp_path / "a")
    centred = _trained_style_head(qwen3)
    with torch.no_grad():
        centred.feature_mean.fill_(0.5)
    with pytest.raises(DraftHeadError, match="feature mean"):
        save_authors(centred, tmp_path / "b")
    tied = DraftHead.random(DraftConfig.for_target(qwen3.config, n_mask=2, double_norm=True))
    with pytest.raises(DraftHeadError, match="tied"):
        save_authors(tied, tmp_path / "c")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
