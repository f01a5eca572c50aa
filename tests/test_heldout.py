"""`train --heldout-set fixed`: one held-out set for every run, whatever its data, so learning curves compare."""

import hashlib
import random
from argparse import Namespace

import pytest

from dart_core.tools.args import CliError
from dart_core.tools.train import split_heldout
from dart_core.training import data
from dart_core.setup.tiny_training import WORDS, SPECIAL, word_tokenizer

CONTENT = WORDS[len(SPECIAL):]


def conversation(rng: random.Random, usable: bool) -> list[dict]:
    user = " ".join(rng.choice(CONTENT) for _ in range(rng.randint(3, 8) if usable else 200))  # too long a prompt
    reply = " ".join(rng.choice(CONTENT) for _ in range(rng.randint(10, 20)))
    return [{"role": "user", "content": user}, {"role": "assistant", "content": reply}]


@pytest.fixture
def pool(monkeypatch, tmp_path):
    """60 ShareGPT conversations (every seventh unusable: its prompt leaves no room) and a small library of 12
    documented functions."""
    rng = random.Random(3)
    convs = [conversation(rng, usable=n % 7 != 3) for n in range(60)]
    monkeypatch.setattr(data, "iter_sharegpt", lambda: iter(convs))
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "mod.py").write_text("".join(f'def f{i}(x):\n    """w{i} w{i + 1}"""\n    y = x + {i}\n    return y\n\n'
                                        for i in range(12)))
    return convs, lib


def lowest_ids(ids, n):
    return sorted(ids, key=lambda i: hashlib.sha256(i.encode()).hexdigest())[:n]


def test_the_fixed_set_is_the_lowest_hashing_usable_records(pool):
    convs, lib = pool
    tok = word_tokenizer()
    held = data.fixed_heldout(tok, 64, chat=5, code=3, stdlib_root=lib)
    usable = [f"sharegpt-text/{n}" for n in range(60) if n % 7 != 3]
    assert [r["id"] for r in held[:5]] == lowest_ids(usable, 5)
    functions = [f"stdlib/{where}" for where, _, _ in data.documented_functions(lib)]
    assert len(functions) == 12 and [r["id"] for r in held[5:]] == lowest_ids(functions, 3)
    assert all(r["response_ids"] for r in held)


def test_runs_with_other_data_share_it_and_never_train_on_its_texts(pool, monkeypatch):
    convs, lib = pool
    tok = word_tokenizer()
    real = data.fixed_heldout
    monkeypatch.setattr("dart_core.tools.train.fixed_heldout", lambda t, m, thinking=False: real(
        t, m, chat=5, code=3, thinking=thinking, stdlib_root=lib))
    args = Namespace(heldout_set="fixed", heldout=48, max_tokens=64, thinking=False)
    held_ids = None
    for seed, limit in ((0, 60), (1, 25)):                       # two runs: other seeds, other amounts of chat
        records = data.sharegpt_sequences(tok, set(), limit, 64, seed)
        answered = [{**r, "id": r["id"].replace("sharegpt-text/", "sharegpt/")} for r in records[:10]]
        heldout, train = split_heldout(records + answered, args, tok)
        ids = [r["id"] for r in heldout]
        assert held_ids is None or ids == held_ids
        held_ids = ids
        held_sources = {data.same_source(i) for i in ids}
        assert not any(data.same_source(r["id"]) in held_sources for r in train)   # as written or answered
        assert len(train) == len([r for r in records + answered if data.same_source(r["id"]) not in held_sources])


def test_random_keeps_the_first_records_and_too_few_is_one_line():
    records = [{"id": f"x/{i}"} for i in range(10)]
    args = Namespace(heldout_set="random", heldout=4, max_tokens=64, thinking=False)
    heldout, train = split_heldout(records, args, None)
    assert heldout == records[:4] and train == records[4:]
    with pytest.raises(CliError, match="too few"):
        split_heldout(records[:5], args, None)
