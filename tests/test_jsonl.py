"""The one JSON Lines reader and its one rule: a line that is not JSON is skipped and counted by its number, never a
stop and never a failure, so a file a long run was writing when it was killed keeps every complete record."""

import gzip
import json

from dart_core.formats.jsonl import JsonLines, append_jsonl, read_jsonl, write_jsonl


def test_a_bad_line_is_skipped_and_named_and_reading_goes_on(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text('{"id": 1}\n\n{"id": 2, "cut mid-wr\n{"id": 3}\nnot json\n[4]\n')
    lines = JsonLines(path)
    assert list(lines) == [(1, {"id": 1}), (4, {"id": 3}), (6, [4])]      # line numbers count the blank line
    assert lines.bad_lines == [3, 5]
    assert lines.skipped() == f"{path}: skipped 2 line(s) that are not JSON (line 3, 5)"
    assert read_jsonl(path) == [{"id": 1}, {"id": 3}, [4]]                 # records after a bad line are kept
    assert capsys.readouterr().err == f"[dart] {path}: skipped 2 line(s) that are not JSON (line 3, 5)\n"
    path.write_text('{"id": 1}\n\n')
    assert read_jsonl(path) == [{"id": 1}] and capsys.readouterr().err == ""   # blank lines are no bad lines


def test_gzipped_files_read_and_write_alike(tmp_path):
    path = tmp_path / "r.jsonl.gz"
    write_jsonl(path, [{"a": 1}, {"b": [2, 3]}])
    assert gzip.decompress(path.read_bytes()).decode() == '{"a": 1}\n{"b": [2, 3]}\n'
    assert read_jsonl(path) == [{"a": 1}, {"b": [2, 3]}]


def test_appending_starts_on_a_line_of_its_own(tmp_path):
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"id": 1}\n{"id": 2, "respo')                  # killed mid-write: the cut record is dropped
    with append_jsonl(cut) as fh:
        fh.write(json.dumps({"id": 2}) + "\n")
    assert cut.read_text() == '{"id": 1}\n{"id": 2}\n'
    whole = tmp_path / "whole.jsonl"
    whole.write_text('{"id": 1}')                                   # complete, only its newline missing: kept
    with append_jsonl(whole) as fh:
        fh.write(json.dumps({"id": 2}) + "\n")
    assert read_jsonl(whole) == [{"id": 1}, {"id": 2}]
    fresh = tmp_path / "new.jsonl"
    with append_jsonl(fresh) as fh:
        fh.write("{}\n")
    assert fresh.read_text() == "{}\n"
