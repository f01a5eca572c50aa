"""Training the draft head end to end on a tiny model (seconds), and what the trained files promise."""

import json
import random
import shutil
from dataclasses import fields, replace

import pytest
import torch

from dart_core.decoding import GenerationConfig, run
from dart_core.draft_head import DraftHead, DraftHeadError
from dart_core.proposers import DartProposer, HeadDrafter
from dart_core.training import data as data_mod, loss as loss_mod
from dart_core.training.head_forward import train_logits
from dart_core.training.anchors import sequence_batch
from dart_core.training.head_setup import choose_draft_vocab
from dart_core.training.loss import SoftCrossEntropy
from dart_core.training.trainer import Trainer, TrainConfig
from dart_core.training.data import cached_example, sequence_example, top_labels
from dart_core.training.records import AnchorBatch, SequenceExample
from dart_core.setup.tiny_models import plain_greedy_reference, tiny_target
from tests.device_reads import DeviceReads


def answered_prompts(n: int, low: int, high: int):
    """The tiny target and n random prompts of 6 tokens in [low, high), each answered greedily for 20 tokens."""
    target = tiny_target("llama", vocab=96, seed=2)
    rng = random.Random(0)
    seqs = []
    for _ in range(n):
        prompt = [rng.randrange(low, high) for _ in range(6)]
        seqs.append(sequence_example(target, prompt, plain_greedy_reference(target, prompt, 20)))
    return target, seqs


@pytest.fixture(scope="module")
def data():
    return answered_prompts(14, 3, 96)


def test_sequence_examples_carry_the_targets_own_labels(data):
    target, seqs = data
    s = seqs[0]
    assert s.features.shape == (s.ids.numel(), 3 * target.hidden_size)
    # the responses are the target's greedy output, so its argmax label at position i is token i+1
    start = s.prompt_len - 1
    assert torch.equal(s.label_ids[start:-1, 0], s.ids[start + 1:])
    assert torch.allclose(s.label_probs.float().sum(-1), torch.ones(s.ids.numel()), atol=0.5)


def test_anchor_targets_line_up(data):
    _, seqs = data
    s = seqs[1]
    batch = sequence_batch(s, 3, 50, random.Random(0), None)
    for a, p in enumerate(batch.anchors.tolist()):
        assert p >= s.prompt_len - 1
        for r in range(3):
            if batch.row_ok[a, r]:  # row r of anchor p: the target's choice for token p + 2 + r
                assert int(batch.argmax[a, r]) == int(s.label_ids[p + 1 + r, 0])


@pytest.mark.parametrize("n_mask", [1, 3])
def test_the_training_forward_gives_forward_trains_logits_and_gradients(data, n_mask):
    target, _ = data
    from dart_core.draft_head import DraftConfig

    cfg = DraftConfig.for_target(target.config, n_mask=n_mask, tie_output=False, draft_vocab_size=40,
                                 standardize_features=True)
    head = DraftHead.random(cfg, seed=3).train()
    gen = torch.Generator().manual_seed(0)
    T, H = 30, target.hidden_size
    feats, embeds = torch.randn(T, 3 * H, generator=gen), torch.randn(T, H, generator=gen)
    for anchors in (torch.tensor([0]), torch.tensor([2, 3, 9, 17, 28]), torch.arange(T - 1)):
        want, got = head.forward_train(feats, embeds, anchors), train_logits(head, feats, embeds, anchors)
        assert got.shape == (len(anchors), n_mask + 1, 40)
        assert torch.allclose(got, want, atol=1e-5)
        weights = torch.randn(want.shape, generator=gen)  # any loss: every row's gradient must match
        grads_want = torch.autograd.grad((want * weights).sum(), list(head.parameters()), allow_unused=True)
        grads_got = torch.autograd.grad((got * weights).sum(), list(head.parameters()), allow_unused=True)
        for (name, _), a, b in zip(head.named_parameters(), grads_want, grads_got):
            assert (a is None) == (b is None), name
            assert a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-4), name


def test_sequences_of_different_lengths_in_one_forward_get_each_their_own_logits_and_gradients(data):
    target, _ = data
    from dart_core.draft_head import DraftConfig

    cfg = DraftConfig.for_target(target.config, n_mask=3, tie_output=False, draft_vocab_size=40,
                                 standardize_features=True)
    head = DraftHead.random(cfg, seed=5).train()
    gen = torch.Generator().manual_seed(1)
    H, lengths = target.hidden_size, (30, 12, 21)
    feats = [torch.randn(T, 3 * H, generator=gen) for T in lengths]
    embeds = [torch.randn(T, H, generator=gen) for T in lengths]
    anchors = [torch.tensor([2, 3, 9, 17, 28]), torch.tensor([0, 10]), torch.tensor([4, 5, 6, 19])]
    # padded as the trainer pads them: features and embeddings with zeros, anchors with position 0
    T, A = max(lengths), max(len(a) for a in anchors)
    batch_feats, batch_embeds = torch.zeros(3, T, 3 * H), torch.zeros(3, T, H)
    batch_anchors = torch.zeros(3, A, dtype=torch.long)
    for b, (f, e, a) in enumerate(zip(feats, embeds, anchors)):
        batch_feats[b, : len(f)], batch_embeds[b, : len(e)], batch_anchors[b, : len(a)] = f, e, a
    together = train_logits(head, batch_feats, batch_embeds, batch_anchors)
    assert together.shape == (3, A, 4, 40)
    weights = [torch.randn(len(a), 4, 40, generator=gen) for a in anchors]
    alone_loss = together_loss = 0
    for b, (f, e, a) in enumerate(zip(feats, embeds, anchors)):
        alone = train_logits(head, f, e, a)
        assert torch.allclose(together[b, : len(a)], alone, atol=1e-5)
        alone_loss = alone_loss + (alone * weights[b]).sum()
        together_loss = together_loss + (together[b, : len(a)] * weights[b]).sum()   # the padding scored nowhere
    params = list(head.parameters())
    for a, b in zip(torch.autograd.grad(alone_loss, params, allow_unused=True),
                    torch.autograd.grad(together_loss, params, allow_unused=True)):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, rtol=1e-4, atol=1e-5))


@pytest.mark.parametrize("sequence_batch", [3, 4])
def test_a_step_trains_the_same_weights_whatever_the_sequences_per_forward(data, tmp_path, sequence_batch):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8, accumulate=4, max_steps=2, eval_every=2, warmup=1,
                      lr=3e-3, bf16=False)
    heads, stats = [], []
    for size in (1, sequence_batch):   # 3: a forward of three, then one of one
        trainer = Trainer(target, seqs[:6], seqs[:3], replace(cfg, sequence_batch=size), tmp_path / str(size),
                          stop_ids={2})
        stats.append([trainer._train_step(lambda i: seqs[3 + i % 11]) for _ in range(2)])
        heads.append(trainer.head)
        assert trainer.sequences_seen == 8
    # Adam moves a weight by up to lr a step whatever its gradient's size, so a gradient near zero turns the two ways'
    # last-bit differences (their products blocked differently) into a few millionths (6e-6 once on an AVX2 EPYC);
    # a batch that mixed or dropped a sequence moves weights by a good part of lr
    for (name, a), b in zip(heads[0].named_parameters(), heads[1].parameters()):
        assert torch.allclose(a, b, rtol=1e-4, atol=cfg.lr * 1e-2), name
    for one, many in zip(*stats):
        assert one["tokens"] == many["tokens"] > 0 and one["row0"] == many["row0"]
        assert one["loss"] == pytest.approx(many["loss"], rel=1e-5)


def test_held_out_metrics_do_not_depend_on_the_sequences_per_forward(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8, bf16=False)
    evaluations = [Trainer(target, seqs[:6], seqs[:5], replace(cfg, sequence_batch=size), tmp_path / str(size),
                           stop_ids={2}).evaluate() for size in (1, 2)]
    one, two = (e.to_dict() for e in evaluations)
    assert one.pop("heldout_loss") == pytest.approx(two.pop("heldout_loss"), rel=1e-5)
    assert one == two and one["anchors"] > 0


def device_stand_in(trainer, monkeypatch) -> DeviceReads:
    """The host's reads of what a GPU would hold: the target's and the head's weights, every batch as copied to the
    device, and all computed from them."""
    reads = DeviceReads(*trainer.head.parameters(), *trainer.target.model.parameters())
    to_device = AnchorBatch.to

    def copied(batch, device):
        on_device = AnchorBatch(**{f.name: getattr(batch, f.name).clone() for f in fields(batch)})
        reads.on_device(*(getattr(on_device, f.name) for f in fields(on_device)))
        return to_device(on_device, device)
    monkeypatch.setattr(AnchorBatch, "to", copied)
    return reads


def test_a_training_step_waits_for_the_device_once_and_an_evaluation_once_per_kind(data, tmp_path, monkeypatch):
    # on a GPU every read of a device value on the host drains the device's queue, and the host, which queues the
    # small kernels of a head's step one by one, then runs behind instead of ahead of it
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8, accumulate=4, sequence_batch=3, warmup=1, bf16=False)
    trainer = Trainer(target, seqs[:6], seqs[:5], cfg, tmp_path, stop_ids={2})
    trainer._train_step(lambda i: seqs[3 + i % 11])   # the optimizer's state made
    reads = device_stand_in(trainer, monkeypatch)
    with reads:
        stats = trainer._train_step(lambda i: seqs[3 + i % 11])   # two forwards: of three sequences, then of one
    assert stats["tokens"] > 0 and dict(reads.reads) == {"tolist": 1}
    waits = []
    for size in (1, 5):   # five held-out groups, then one
        trainer.cfg = replace(cfg, sequence_batch=size)
        reads.reads.clear()
        with reads:
            assert trainer.evaluate().anchors > 0
        waits.append(dict(reads.reads))
    assert waits[0] == waits[1] and sum(waits[0].values()) <= 4


def reference_soft_ce(logits, ids, probs):
    return -(probs * torch.log_softmax(logits.float(), dim=-1).gather(-1, ids)).sum(-1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_chunked_soft_cross_entropy_is_autograds(monkeypatch, dtype):
    monkeypatch.setattr(loss_mod, "LOSS_CHUNK_ROWS", 4)  # 7 * 3 rows: chunks, and a short last one
    gen = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(7, 3, 50, generator=gen)).to(dtype)
    ids = torch.randint(0, 50, (7, 3, 4), generator=gen)
    probs = torch.rand(7, 3, 4, generator=gen)
    probs = probs / probs.sum(-1, keepdim=True)
    probs[0, 1] = 0                           # a row with no mass (no label inside the draft vocabulary)
    ids[1, 2, 2:], probs[1, 2, 2:] = 0, 0     # labels outside the vocabulary: id 0 twice, with no mass
    weights = torch.rand(7, 3, generator=gen)
    mine, ref = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    loss, want = SoftCrossEntropy.apply(mine, ids, probs), reference_soft_ce(ref, ids, probs)
    assert torch.allclose(loss, want, atol=1e-5)
    (loss * weights).sum().backward()
    (want * weights).sum().backward()
    assert mine.grad.dtype == dtype
    # the logits are left as they were: the training step reads its row statistics from them after backward
    # (in fp32, `.float()` is the tensor itself, and an in-place softmax overwrote it: the bar showed row-0 0.07)
    assert torch.equal(mine.detach(), logits)
    rtol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # bf16: one rounding of the same float gradient
    assert torch.allclose(mine.grad.float(), ref.grad.float(), atol=1e-6, rtol=rtol)


def test_top_labels_are_the_softmaxs_top_k(monkeypatch):
    monkeypatch.setattr(data_mod, "LABEL_CHUNK_ROWS", 3)
    logits = 4 * torch.randn(10, 96, generator=torch.Generator().manual_seed(1))
    ids, probs = top_labels(logits, k=5)
    want = logits.softmax(-1).topk(5, dim=-1)
    assert torch.equal(ids, want.indices) and torch.allclose(probs, want.values, atol=1e-6)


def same_example(a, b) -> bool:
    a, b = (x.to_dict() if isinstance(x, SequenceExample) else x for x in (a, b))   # a cache file holds the dict
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


def test_the_feature_cache_runs_the_target_once_per_sequence(data, tmp_path, monkeypatch):
    target, _ = data
    prompt, response = [5, 17, 33, 8], [9, 10, 11, 12, 13]
    first = cached_example(tmp_path, target, prompt, response)
    assert same_example(first, sequence_example(target, prompt, response))
    (path,) = tmp_path.glob("*.pt")
    with monkeypatch.context() as m:
        m.setattr(data_mod, "sequence_examples", lambda *a: pytest.fail("the target ran again"))
        assert same_example(cached_example(tmp_path, target, prompt, response), first)
    other = cached_example(tmp_path, target, prompt, response[:-1])  # another sequence: its own file
    assert len(list(tmp_path.glob("*.pt"))) == 2 and other.ids.numel() == 8
    path.write_bytes(path.read_bytes()[:100])  # a file cut short by a stop is computed again
    assert same_example(cached_example(tmp_path, target, prompt, response), first)
    assert same_example(torch.load(path, weights_only=True), first)


def test_a_full_disk_stops_the_feature_cache_not_the_training(data, tmp_path, monkeypatch):
    target, _ = data
    prompt, response = [5, 17, 33, 8], [9, 10, 11, 12, 13]
    monkeypatch.setattr(data_mod, "CACHE_FREE_FLOOR", shutil.disk_usage(tmp_path).free + (1 << 40))
    with pytest.warns(UserWarning, match="stops growing"):
        low = cached_example(tmp_path, target, prompt, response)
    assert same_example(low, sequence_example(target, prompt, response)) and not list(tmp_path.iterdir())
    monkeypatch.setattr(data_mod, "CACHE_FREE_FLOOR", 0)
    monkeypatch.setattr(torch, "save", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.warns(UserWarning, match="could not store"):
        cut = cached_example(tmp_path, target, prompt, response)
    assert same_example(cut, low) and not list(tmp_path.iterdir())   # no half-written file left behind


def assert_same_up_to_rounding(batched: SequenceExample, alone: SequenceExample) -> None:
    """One sequence's example from a padded forward against its own forward's: the same tokens and labels, the
    features and probabilities equal up to the rounding of a differently blocked matmul."""
    assert torch.equal(batched.ids, alone.ids) and batched.prompt_len == alone.prompt_len
    assert torch.allclose(batched.features.float(), alone.features.float(), atol=0.02, rtol=0.01)
    assert torch.allclose(batched.label_probs.float(), alone.label_probs.float(), atol=2e-3)
    # near-ties may swap places (a random tiny model's are flat), and the 8th may trade with the 9th, not kept:
    # each of the batched first seven is among the forward's own eight, with its probability
    for ids, probs, own_ids, own_probs in zip(batched.label_ids.tolist(), batched.label_probs.tolist(),
                                              alone.label_ids.tolist(), alone.label_probs.tolist()):
        own = dict(zip(own_ids, own_probs))
        assert all(i in own and abs(own[i] - p) < 2e-3 for i, p in zip(ids[:-1], probs[:-1]))


def test_a_padded_forward_gives_each_sequence_its_own_forwards_example(data):
    target, _ = data
    rng = random.Random(5)
    pairs = [([rng.randrange(3, 96) for _ in range(n)], [rng.randrange(3, 96) for _ in range(m)])
             for n, m in ((6, 20), (3, 4), (9, 13), (6, 20))]           # lengths 26, 7, 22, 26: padding and none
    batched = data_mod.sequence_examples(target, pairs)
    for example, (prompt, response) in zip(batched, pairs):
        assert example.features.shape == (len(prompt) + len(response), 3 * target.hidden_size)
        assert_same_up_to_rounding(example, sequence_example(target, prompt, response))


def test_the_example_stream_runs_the_target_once_per_group_for_the_sequences_asked(data, tmp_path, monkeypatch):
    target, _ = data
    rng = random.Random(6)
    records = [{"prompt_ids": [rng.randrange(3, 96) for _ in range(5)],
                "response_ids": [rng.randrange(3, 96) for _ in range(rng.randrange(3, 12))]} for _ in range(5)]
    widths = []
    real = target.forward_padded
    monkeypatch.setattr(target, "forward_padded",
                        lambda ids, lengths: widths.append(len(lengths)) or real(ids, lengths))
    # the second of two processes, 2 sequences each per step: it asks for 2, 3, then 6, 7, then 10, 11
    stream = data_mod.ExampleStream(target, records, group=4, accumulate=2, world=2)
    assert stream.upcoming(2) == [2, 3, 6, 7]
    got = [stream(i) for i in (2, 3, 6, 7, 10, 11)]
    assert widths == [4, 4]                       # one forward per group (the second one holds 14 and 15 too)
    for i, example in zip((2, 3, 6, 7, 10, 11), got):
        r = records[i % len(records)]
        assert_same_up_to_rounding(example, sequence_example(target, r["prompt_ids"], r["response_ids"]))
    cached = data_mod.ExampleStream(target, records, group=3, cache_dir=tmp_path)
    first = [cached(i) for i in range(3)]
    widths.clear()
    again = data_mod.ExampleStream(target, records, group=3, cache_dir=tmp_path)
    assert all(same_example(a, b) for a, b in zip((again(i) for i in range(3)), first)) and widths == []


def test_the_head_trains_in_bf16_only_where_bf16_is_native(data, tmp_path, monkeypatch):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8)
    for native, asked, dtype in ((True, True, torch.bfloat16), (False, True, torch.float32),
                                 (True, False, torch.float32)):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
        trainer = Trainer(target, seqs[:6], seqs[:3], replace(cfg, bf16=asked), tmp_path, stop_ids={2})
        _, logits, _ = trainer._forward([seqs[0]], [random.Random(0)])
        assert trainer.bf16 == (dtype == torch.bfloat16) and logits.dtype == dtype


def test_training_runs_end_to_end_and_the_head_decodes_losslessly(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8, accumulate=2, max_steps=6, eval_every=3, warmup=2,
                      lr=3e-3)
    trainer = Trainer(target, seqs[:6], seqs[:3], cfg, tmp_path / "run", stop_ids={2})
    result = trainer.fit(lambda i: seqs[3 + i % 11], command="test")
    assert result["steps"] == 6 and trainer.sequences_seen == 12
    assert [m["step"] for m in trainer.history] == [3, 6]  # evaluated every 3 steps, the last step once
    assert (tmp_path / "run" / "ckpt.pt").is_file()
    head = DraftHead.load(tmp_path / "run" / "best")
    assert head.config.draft_vocab_size == 48 and head.config.extra["command"] == "test"
    assert 2 in head.d2t.tolist()  # stop ids are always in the draft vocabulary
    held = head.config.extra["heldout"]
    assert held["heldout_loss"] > 0
    # the chain-length histogram accounts for every anchor and gives back the chain tau
    lengths = held["chain_lengths"]
    assert len(lengths) == cfg.n_mask + 2 and sum(lengths) == held["anchors"]
    assert held["chain_tau"] == pytest.approx(1 + sum(k * c for k, c in enumerate(lengths)) / sum(lengths), abs=1e-4)
    # resuming continues from the checkpoint with fresh sequences
    again = Trainer(target, seqs[:6], seqs[:3], TrainConfig(**{**cfg.__dict__, "max_steps": 8}), tmp_path / "run",
                    stop_ids={2})
    assert again.resume() and again.step == 6 and again.sequences_seen == 12
    again.fit(lambda i: seqs[3 + i % 11], command="test again")
    assert again.step == 8
    sessions = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=False)["sessions"]
    assert [(s["command"], s["from_step"]) for s in sessions] == [("test", 0), ("test again", 6)]
    assert all(s["minutes"] > 0 for s in sessions)  # each session's training time is on record
    prompt = [5, 17, 33, 8]
    expected = plain_greedy_reference(target, prompt, 16)
    assert run(target, DartProposer(HeadDrafter(head, target)), prompt,
               GenerationConfig(max_new_tokens=16)).output_ids == expected


@pytest.fixture(scope="module")
def repetitive():
    """Prompts over six tokens, answered greedily: the tiny target falls into repeating one token, so the head can
    learn in a few steps what the held-out sequences (other prompts over the same tokens) need."""
    return answered_prompts(12, 10, 16)


def test_a_few_steps_lower_the_heldout_loss(repetitive, tmp_path):
    target, seqs = repetitive
    heldout, train = seqs[:4], seqs[4:]
    assert not any(torch.equal(h.ids, s.ids) for h in heldout for s in train)  # truly held out
    cfg = TrainConfig(n_mask=2, draft_vocab=48, anchors=8, accumulate=1, max_steps=20, eval_every=10, warmup=2,
                      lr=3e-3)
    trainer = Trainer(target, train, heldout, cfg, tmp_path / "run", stop_ids={2})
    before = trainer.evaluate()
    trainer.fit(lambda i: train[i % len(train)])
    after = trainer.history[-1]
    assert after["step"] == 20
    assert after["heldout_loss"] < 0.5 * before.heldout_loss
    assert after["chain_tau"] > before.chain_tau + 1.0  # and the greedy chain gets accepted further


def test_draft_vocab_prefers_frequent_target_tokens(data):
    _, seqs = data
    d2t = choose_draft_vocab(seqs, 10, must_include=[2])
    assert len(d2t) == 10 and 2 in d2t.tolist() and torch.equal(d2t, d2t.sort().values)
    counts = torch.zeros(96)
    for s in seqs:
        counts += torch.bincount(s.label_ids[s.prompt_len - 1:, 0].long(), minlength=96)
    chosen = set(d2t.tolist()) - {2}
    others = set(range(96)) - chosen - {2}
    assert min(counts[t] for t in chosen) >= max(counts[t] for t in others)


def test_head_trained_for_another_model_is_refused(data, tmp_path):
    target, _ = data
    from dart_core.draft_head import DraftConfig

    cfg = DraftConfig.for_target(target.config, n_mask=2, target_name="SomeOtherModel")
    head = DraftHead.random(cfg)
    target.config._name_or_path = "/models/ThisModel"
    try:
        with pytest.raises(DraftHeadError, match="trained for 'SomeOtherModel'.*'ThisModel'"):
            head.check_target(target)
    finally:
        target.config._name_or_path = ""


def test_corpus_counts_steer_the_draft_vocab(data):
    _, seqs = data
    corpus = torch.zeros(96, dtype=torch.float64)
    corpus[90] = 1e6  # a token the sample never shows, but the corpus says is everywhere
    assert 90 in choose_draft_vocab(seqs, 10, corpus_counts=corpus).tolist()
    assert 90 not in choose_draft_vocab(seqs, 10).tolist()


def test_resume_keeps_the_checkpoints_draft_vocab(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=1, draft_vocab=20, anchors=4, accumulate=1, max_steps=2, eval_every=2, warmup=1)
    first = Trainer(target, seqs[:6], seqs[:2], cfg, tmp_path / "r", stop_ids={2})
    first.fit(lambda i: seqs[2 + i % 10])
    corpus = torch.zeros(96, dtype=torch.float64)
    corpus[80:96] = 1e6  # a different sample would now choose another vocabulary
    again = Trainer(target, seqs[:6], seqs[:2], cfg, tmp_path / "r", stop_ids={2}, corpus_counts=corpus)
    assert not torch.equal(again.head.d2t, first.head.d2t)
    assert again.resume()
    assert torch.equal(again.head.d2t, first.head.d2t)
    assert torch.equal(again.t2d[again.head.d2t], torch.arange(20))


def test_a_run_killed_between_evaluations_resumes_from_its_timed_checkpoint_as_if_never_stopped(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=20, anchors=4, accumulate=1, max_steps=5, eval_every=100, warmup=1,
                      bf16=False, checkpoint_minutes=1e-9)   # no evaluation before the end; a checkpoint every step

    def run(folder):
        return Trainer(target, seqs[:6], seqs[:2], cfg, tmp_path / folder, stop_ids={2})

    whole = run("whole")
    whole.fit(lambda i: seqs[2 + i % 10])

    class MachineGone(Exception):
        pass

    def gone_at_the_fourth_sequence(i):
        if i == 3:
            raise MachineGone
        return seqs[2 + i % 10]

    with pytest.raises(MachineGone):
        run("killed").fit(gone_at_the_fourth_sequence)
    again = run("killed")
    assert again.resume() and again.step == 3 and not again.history   # steps 1-3 kept without an evaluation
    again.fit(lambda i: seqs[2 + i % 10])
    assert again.step == whole.step == 5 and again.tokens_seen == whole.tokens_seen
    for name, weight in whole.head.state_dict().items():
        assert torch.equal(again.head.state_dict()[name], weight), name
    assert again.history[-1]["chain_tau"] == whole.history[-1]["chain_tau"]
    assert [s["from_step"] for s in again.sessions] == [0, 3]


def test_resume_with_a_larger_draft_vocab_keeps_what_was_learned(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=1, draft_vocab=20, anchors=4, accumulate=1, max_steps=2, eval_every=2, warmup=1)
    first = Trainer(target, seqs[:6], seqs[:2], cfg, tmp_path / "r", stop_ids={2})
    first.fit(lambda i: seqs[2 + i % 10])
    bigger = Trainer(target, seqs[:6], seqs[:2], TrainConfig(**{**cfg.__dict__, "draft_vocab": 32, "max_steps": 4}),
                     tmp_path / "r", stop_ids={2})
    assert bigger.resume() and bigger.step == 2
    old, new = first.head.d2t, bigger.head.d2t
    assert len(new) == 32 and torch.equal(new, new.sort().values) and torch.isin(old, new).all()
    assert torch.equal(bigger.t2d[new], torch.arange(32))
    # every old token keeps its learned output row; new tokens start from the target's rows
    rows = torch.searchsorted(new, old)
    assert torch.equal(bigger.head.lm_head.weight[rows], first.head.lm_head.weight)
    fresh = torch.tensor([i for i in range(32) if i not in set(rows.tolist())])
    assert torch.allclose(bigger.head.lm_head.weight[fresh], target.lm_head.weight[new[fresh]].float())
    assert torch.equal(bigger.head.fc.weight, first.head.fc.weight)
    moments = bigger.opt.state[bigger.head.lm_head.weight]
    assert moments["exp_avg_sq"].shape == (32, target.hidden_size) and (moments["exp_avg_sq"][fresh] > 0).all()
    bigger.fit(lambda i: seqs[2 + i % 10])  # and training goes on
    assert bigger.step == 4
    assert len(torch.load(tmp_path / "r" / "ckpt.pt", weights_only=False)["head"]["d2t"]) == 32


def test_a_run_started_from_a_trained_head_keeps_it_and_its_training_time(data, tmp_path):
    target, seqs = data
    cfg = TrainConfig(n_mask=2, draft_vocab=40, anchors=6, accumulate=1, max_steps=3, eval_every=3, warmup=1)
    Trainer(target, seqs[:6], seqs[:3], cfg, tmp_path / "first", stop_ids={2}).fit(lambda i: seqs[3 + i % 11], "a")
    start = DraftHead.load(tmp_path / "first" / "best")
    start.config.extra["train_minutes"] = 100.0  # as if the first run had trained for 100 minutes
    start_weights = {k: v.clone() for k, v in start.state_dict().items()}
    # a different vocabulary request and K are ignored: the starting head's own are kept
    second = Trainer(target, seqs[:6], seqs[:3], TrainConfig(**{**cfg.__dict__, "draft_vocab": 20, "n_mask": 4}),
                     tmp_path / "second", stop_ids={2}, start_head=start)
    assert torch.equal(second.head.d2t, start_weights["d2t"])
    assert torch.equal(second.t2d[second.head.d2t], torch.arange(40))
    second.fit(lambda i: seqs[3 + i % 11], "b")
    # evaluated before its first step (the bar to beat), then on schedule
    assert [m["step"] for m in second.history] == [0, 3]
    assert not torch.equal(second.head.fc.weight, start_weights["fc.weight"])  # it trained
    saved = DraftHead.load(tmp_path / "second" / "best").config.extra
    assert saved["started_from"]["command"] == "a"
    assert saved["train_minutes_total"] == pytest.approx(100.0 + saved["train_minutes"], abs=0.1)
    # a starting head that never recorded its training time gives no total rather than a wrong one
    untimed = DraftHead.load(tmp_path / "first" / "best")
    del untimed.config.extra["train_minutes"]
    third = Trainer(target, seqs[:6], seqs[:3], cfg, tmp_path / "third", stop_ids={2}, start_head=untimed)
    third.fit(lambda i: seqs[3 + i % 11], "c")
    assert DraftHead.load(tmp_path / "third" / "best").config.extra["train_minutes_total"] is None
    # resumed with --init-from naming another head (the asset replaced by a newer one), the run keeps its lineage
    again = Trainer(target, seqs[:6], seqs[:3], TrainConfig(**{**cfg.__dict__, "max_steps": 4}), tmp_path / "second",
                    stop_ids={2}, start_head=untimed)
    assert again.resume() and again.started_from.get("train_minutes") == 100.0   # the first head, not `untimed`


def test_stdlib_functions_become_humaneval_style_sequences(tmp_path):
    from dart_core.training.data import documented_functions, stdlib_code_sequences

    lib = tmp_path / "lib"
    (lib / "pkg").mkdir(parents=True)
    (lib / "test").mkdir()
    (lib / "pkg" / "mod.py").write_text(
        'class Box:\n    def area(self, scale=1):\n        """Area of the box."""\n'
        '        w = self.w * scale\n        return w * self.h\n\n'
        'def undocumented(x):\n    y = x\n    return y\n\n'
        'def only_a_docstring():\n    """Nothing else."""\n')
    (lib / "test" / "test_mod.py").write_text('def test_it():\n    """Tests are not training data."""\n    x = 1\n'
                                              '    assert x\n')
    (lib / "broken.py").write_text("def oops(:\n")
    found = list(documented_functions(lib))
    assert found == [("pkg/mod.py:2", 'def area(self, scale=1):\n    """Area of the box."""',
                      "def area(self, scale=1):\n    w = self.w * scale\n    return w * self.h")]

    class CharTokenizer:  # one id per character; the chat template as SmolLM2's
        # extra keywords are template variables (enable_thinking), as transformers' tokenizers take them
        def apply_chat_template(self, turns, add_generation_prompt, tokenize, return_dict, **template_vars):
            text = "".join(f"<{t['role']}>{t['content']}<end>" for t in turns)
            return [ord(c) for c in text + ("<assistant>" if add_generation_prompt else "")]

    (seq,) = stdlib_code_sequences(CharTokenizer(), limit=10, max_tokens=400, root=lib)
    prompt, response = "".join(map(chr, seq["prompt_ids"])), "".join(map(chr, seq["response_ids"]))
    assert seq["id"] == "stdlib/pkg/mod.py:2"
    assert prompt.startswith("<user>Complete the following Python function.") and '"""Area' in prompt
    assert response.startswith("```python\ndef area(self, scale=1):\n    w = self.w") and "Area" not in response
    assert stdlib_code_sequences(CharTokenizer(), limit=10, max_tokens=60, root=lib) == []  # too long to fit


def test_init_from_a_folder_that_is_no_head_or_fits_another_model_is_a_clear_error(data, tmp_path):
    from dart_core.tools.args import CliError
    from dart_core.draft_head import DraftConfig
    from dart_core.tools.train import _starting_head

    target, _ = data
    with pytest.raises(CliError, match=r"--init-from .*: no config.json in .*not a draft head folder"):
        _starting_head(tmp_path, target)
    DraftHead.random(DraftConfig.for_target(target.config, n_mask=2, target_name="SomeOtherModel")).save(tmp_path)
    target.config._name_or_path = "/models/ThisModel"
    try:
        with pytest.raises(CliError, match="--init-from .*trained for 'SomeOtherModel'"):
            _starting_head(tmp_path, target)
    finally:
        target.config._name_or_path = ""


def test_a_head_in_the_authors_architecture_starts_from_the_targets_output(data, tmp_path):
    """--format authors: a double norm, features scaled without a mean, and the target's norm weight folded into
    the output rows, so lm_head(n(n(h))) starts as the target's lm_head(norm(h)) on the draft vocabulary."""
    target, seqs = data
    trainer = Trainer(target, seqs[:6], seqs[:3], TrainConfig(n_mask=2, draft_vocab=48, anchors=8,
                                                              head_format="authors"), tmp_path, stop_ids={2})
    head = trainer.head
    assert head.config.double_norm and torch.equal(head.feature_mean, torch.zeros_like(head.feature_mean))
    h = 3 * torch.randn(5, target.hidden_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = head.lm_head(head.final_norm(head.final_norm(h)))
        theirs = target.lm_head(target.model.model.norm(h))[:, head.d2t]
    assert torch.allclose(ours, theirs, atol=1e-3, rtol=1e-4)


def test_a_checkpoint_resumes_only_in_its_own_format(data, tmp_path):
    from dart_core.training.trainer import TrainingError

    target, seqs = data
    cfg = TrainConfig(n_mask=1, draft_vocab=20, anchors=4, accumulate=1, max_steps=1, eval_every=1, warmup=1)
    Trainer(target, seqs[:6], seqs[:2], cfg, tmp_path / "r", stop_ids={2}).fit(lambda i: seqs[2 + i % 10])
    other = Trainer(target, seqs[:6], seqs[:2], replace(cfg, head_format="authors"), tmp_path / "r", stop_ids={2})
    with pytest.raises(TrainingError, match="a run with --format dartlab; resume it with --format dartlab"):
        other.resume()


def test_generated_responses_are_greedy_resume_and_skip_prompts_answered_before(tmp_path, monkeypatch):
    from dart_core.formats.jsonl import JsonLines
    from dart_core.training.data import ResponseSettings, generate_responses, sharegpt_prompts
    from dart_core.setup.tiny_training import random_text, word_tokenizer

    rng = random.Random(1)
    convs = [[{"role": "user", "content": random_text(rng, 3, 9)}, {"role": "assistant", "content": "w1"}]
             for _ in range(7)]
    monkeypatch.setattr(data_mod, "iter_sharegpt", lambda: iter(convs))
    tok, target = word_tokenizer(), tiny_target("qwen3", vocab=96, seed=4)
    order = [pid for pid, _ in sharegpt_prompts(tok, 7, 192)]
    out = tmp_path / "responses.jsonl"

    def answer(limit, skip=0):
        return generate_responses(target.model, tok, out, ResponseSettings(limit, skip, batch_size=2, max_new_tokens=6))

    assert answer(3) == 3
    with open(out, "a") as fh:
        fh.write(json.dumps({"id": order[3], "prompt_ids": [1, 2, 3]})[:20])   # a kill cut the next answer's write
    assert answer(3) == 0  # resumed: those prompts are answered already
    assert answer(2, skip=3) == 2  # the next two, none of the first three again (the cut one answered anew)
    lines = JsonLines(out)
    records = lines.values()
    assert lines.bad_lines == []      # the cut record was dropped before appending: every line reads
    assert sorted(r["id"] for r in records) == sorted(order[:5])
    for r in records:  # batched, left-padded generation gives each prompt's own greedy answer
        assert r["response_ids"] == plain_greedy_reference(target, r["prompt_ids"], 6)


@pytest.mark.parametrize("batched_cost, chosen", [(1.0, 3), (5.0, 1)])
def test_auto_keeps_the_feature_batch_that_measures_faster(data, monkeypatch, batched_cost, chosen):
    target, _ = data
    rng = random.Random(7)
    records = [{"prompt_ids": [rng.randrange(3, 96) for _ in range(5)],
                "response_ids": [rng.randrange(3, 96) for _ in range(8)]} for _ in range(6)]   # 13 tokens each
    clock = [0.0]   # a forward of one sequence costs 1; of three, batched_cost
    real = target.forward_padded

    def timed(ids, lengths):
        clock[0] += 1.0 if len(lengths) == 1 else batched_cost
        return real(ids, lengths)

    monkeypatch.setattr(target, "forward_padded", timed)
    monkeypatch.setattr(data_mod, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: clock[0])}))
    stream = data_mod.ExampleStream(target, records, group=3, measure=True)
    got = [stream(i) for i in range(9)]            # trials on 0-2 (one per forward) and 3-5 (three), then chosen
    assert stream.group == chosen and f"{chosen} sequence(s) per forward: measured" in stream.choice
    assert clock[0] == 3 + batched_cost + (batched_cost if chosen == 3 else 3)
    for i, example in enumerate(got):
        r = records[i % len(records)]
        assert_same_up_to_rounding(example, sequence_example(target, r["prompt_ids"], r["response_ids"]))


def test_typed_records_keep_the_formats_files_hold():
    from dart_core.training.records import Evaluation, RowStats
    example = SequenceExample(torch.arange(4, dtype=torch.int32), 2, torch.zeros(4, 6, dtype=torch.bfloat16),
                              torch.tensor([[1, 2]] * 4, dtype=torch.int32), torch.full((4, 2), 0.5).half())
    stored = example.to_dict()          # what a feature cache file holds, before these types and after
    assert list(stored) == ["ids", "prompt_len", "features", "label_ids", "label_probs"]
    assert same_example(SequenceExample.from_dict(stored), example)
    assert example.response_argmax().tolist() == [1, 1, 1]
    # an evaluation as metrics.json, the checkpoint and the learning curve read it: the same keys, in order
    evaluation = Evaluation(0.5, [0.4, 0.2], 1.6, 2.1, 10, [6, 2, 2])
    assert evaluation.to_dict() == {"heldout_loss": 0.5, "row_top1": [0.4, 0.2], "chain_tau": 1.6,
                                    "top3_tau_bound": 2.1, "anchors": 10, "chain_lengths": [6, 2, 2]}
    total = RowStats.zeros(2) + RowStats(torch.tensor([3.0, 1.0]), torch.tensor(4.0), torch.tensor(4.0),
                                         torch.tensor(6.0), torch.tensor([1.0, 2.0, 1.0]))
    assert total.rows == 4 and total.hit1.tolist() == [3.0, 1.0] and total.chain_hist.tolist() == [1.0, 2.0, 1.0]
