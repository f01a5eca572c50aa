"""A user's own chats as training data (--chats), and what the trainer refuses in one line: a target it does not
serve, a missing file, a conversation with no reply to learn from, a file with none; a line that is not JSON is
skipped and named (dart_core.formats.jsonl's rule for every JSON Lines file)."""

import json

import pytest

from dart_core.tools.cli import main
from dart_core.training.chats import TrainingDataError, chat_file_records, read_chats
from dart_core.setup.tiny_training import WORDS, save_tiny_qwen3, word_tokenizer, write_chats


def words(ids):
    return [WORDS[i] for i in ids]


def test_both_shapes_are_read_and_every_reply_is_a_sequence(tmp_path):
    path = tmp_path / "chats.jsonl"
    path.write_text(
        json.dumps({"messages": [{"role": "system", "content": "w1"}, {"role": "user", "content": "w2 w3"},
                                 {"role": "assistant", "content": "w4 w5 w6"}, {"role": "user", "content": "w7"},
                                 {"role": "assistant", "content": "w8 w9"}]}) + "\n\n" +
        json.dumps({"conversations": [{"from": "human", "value": "w10"}, {"from": "gpt", "value": "w11 w12"}]}) + "\n")
    assert read_chats(path)[1] == [{"role": "user", "content": "w10"}, {"role": "assistant", "content": "w11 w12"}]
    records, counts = chat_file_records(word_tokenizer(), path, max_tokens=512)
    assert counts == {"conversations": 2, "records": 3, "dropped": 0}
    first, second, third = records
    # a reply's prompt is the conversation before it, in the template; thinking off: an empty reasoning block
    assert words(first["prompt_ids"]) == ["<|im_start|>", "system", "w1", "<|im_end|>", "<|im_start|>", "user", "w2",
                                          "w3", "<|im_end|>", "<|im_start|>", "assistant", "<think>", "</think>"]
    assert words(first["response_ids"]) == ["w4", "w5", "w6", "<|im_end|>"]
    # the second reply's prompt holds the first exchange (that reply without a reasoning block, as Qwen3's does)
    assert words(second["prompt_ids"])[9:] == ["<|im_start|>", "assistant", "w4", "w5", "w6", "<|im_end|>",
                                               "<|im_start|>", "user", "w7", "<|im_end|>", "<|im_start|>",
                                               "assistant", "<think>", "</think>"]
    assert words(second["response_ids"]) == ["w8", "w9", "<|im_end|>"]
    assert words(third["response_ids"]) == ["w11", "w12", "<|im_end|>"]
    # thinking on (Qwen3's switch): the prompt stops at the assistant's header, the reply holds the block
    on, _ = chat_file_records(word_tokenizer(), path, max_tokens=512, thinking=True)
    assert words(on[2]["prompt_ids"])[-2:] == ["<|im_start|>", "assistant"]
    assert words(on[2]["response_ids"]) == ["<think>", "</think>", "w11", "w12", "<|im_end|>"]


def test_replies_that_do_not_fit_are_counted_not_trained_on(tmp_path):
    path = tmp_path / "c.jsonl"
    long_prompt = " ".join(["w3"] * 40)
    path.write_text(json.dumps({"messages": [{"role": "user", "content": long_prompt},
                                             {"role": "assistant", "content": "w4 w5"}]}) + "\n" +
                    json.dumps({"messages": [{"role": "user", "content": "w1"},
                                             {"role": "assistant", "content": "w4 w5"}]}) + "\n")
    records, counts = chat_file_records(word_tokenizer(), path, max_tokens=60)
    assert counts == {"conversations": 2, "records": 1, "dropped": 1} and len(records) == 1


@pytest.mark.parametrize("line, message", [
    ('["a list"]', r"c.jsonl:2: a JSON object"),
    ('{"text": "w1"}', r"c.jsonl:2: no 'messages'"),
    ('{"messages": [{"role": "user", "content": "w1"}]}', r"c.jsonl:2: no assistant turn"),
    ('{"messages": [{"role": "assistant", "content": "w1"}]}', r"c.jsonl:2: no assistant turn"),
    ('{"messages": [{"role": "user", "content": "w1"}, {"role": "bot", "content": "w2"}]}',
     r"c.jsonl:2: turn 2 has role 'bot'"),
    ('{"conversations": [{"from": "human", "value": "w1"}, {"from": "gpt", "value": 7}]}',
     r"c.jsonl:2: turn 2 has no text in 'value'"),
])
def test_a_bad_line_is_named_by_file_and_line(tmp_path, line, message):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]})
    path.write_text(good + "\n" + line + "\n" + good + "\n")
    with pytest.raises(TrainingDataError, match=message):
        read_chats(path)


def test_a_line_that_is_not_json_is_skipped_and_named(tmp_path, capsys):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"messages": [{"role": "user", "content": "w1"}, {"role": "assistant", "content": "w2"}]})
    path.write_text(good + "\n{not json\n" + good + "\n")
    assert len(read_chats(path)) == 2
    assert f"{path}: skipped 1 line(s) that are not JSON (line 2)" in capsys.readouterr().err
    path.write_text("{not json\nnor this\n")                     # nothing left to train on: refused
    with pytest.raises(TrainingDataError, match=r"no conversations in the file \(2 line\(s\) not JSON\)"):
        read_chats(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny") / "qwen3"
    save_tiny_qwen3(folder)
    return folder


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "Traceback" not in err
    return err


def test_the_command_refuses_bad_data_and_targets_in_one_line(tmp_path, model_dir, capsys):
    good = write_chats(tmp_path / "good.jsonl", 4)
    base = ["train", "--model", str(model_dir), "--out", str(tmp_path / "out"), "--sharegpt", "0"]
    assert "no such file" in _one_line_error(capsys, [*base, "--chats", str(tmp_path / "missing.jsonl")])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good.read_text() + '{"messages": []}\n')
    assert f"{bad}:5: no assistant turn" in _one_line_error(capsys, [*base, "--chats", str(good), "--chats",
                                                                     str(bad)])
    other = tmp_path / "gpt2"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    err = _one_line_error(capsys, ["train", "--model", str(other), "--out", str(tmp_path / "o"), "--chats", str(good)])
    assert "'gpt2' model" in err and "Llama, Qwen2, Qwen3" in err
    seq2seq = tmp_path / "t5ish"
    seq2seq.mkdir()
    (seq2seq / "config.json").write_text(json.dumps({"model_type": "qwen3", "architectures": ["Qwen3ForTokenClassification"]}))
    assert "causal LMs" in _one_line_error(capsys, ["train", "--model", str(seq2seq), "--out", str(tmp_path / "o")])


def test_the_default_vocabulary_counts_are_skipped_for_another_vocabulary():
    """--vocab-ngram default is the default model's table: for a target with another vocabulary it is not used
    (it once crashed the run); a table named by the user that does not fit is a one-line error."""
    from dart_core.setup.ngram_tables import ensure_default_ngram
    from dart_core.tools.args import CliError
    from dart_core.tools.train import unigram_counts

    assert unigram_counts("default", 96) is None
    assert unigram_counts("default", 49152).shape == (49152,)
    with pytest.raises(CliError, match="counts a vocabulary of 49152; the target has 96"):
        unigram_counts(str(ensure_default_ngram()), 96)
