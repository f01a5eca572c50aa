"""A user's own chats as training data: JSONL files, one conversation per line, read and checked line by line.

Two shapes are read, the common one and ShareGPT's:
    {"messages": [{"role": "system" | "user" | "assistant", "content": "..."}, ...]}
    {"conversations": [{"from": "system" | "human" | "gpt", "value": "..."}, ...]}
Every assistant turn after at least one other turn becomes one training record: the conversation so far as the
prompt (in the target's chat template), that reply as the response. A conversation the trainer cannot use (no
turns, an unknown role, content that is not text, no assistant reply) stops the run with one line naming the file
and the line: training on half of a file by mistake costs hours. A line that is not JSON at all is skipped and named
in a warning, as in every JSON Lines file (dart_core.formats.jsonl says why); a file with no conversation left stops
the run.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import DartError
from ..formats.jsonl import JsonLines, warn_skipped
from .data import turns_record

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "human": "user", "gpt": "assistant"}


class TrainingDataError(DartError):
    """A training data file that is missing or has a line the trainer cannot use; the message names both."""


def read_chats(path) -> list[list[dict]]:
    """The conversations of a JSONL file, each a list of {"role", "content"} turns (blank lines skipped)."""
    p = Path(path)
    if not p.is_file():
        raise TrainingDataError(f"--chats {p}: no such file")
    lines = JsonLines(p)
    conversations = [_conversation(data, f"{p}:{number}") for number, data in lines]
    warn_skipped(lines)
    if not conversations:
        not_json = f" ({len(lines.bad_lines)} line(s) not JSON)" if lines.bad_lines else ""
        raise TrainingDataError(f"--chats {p}: no conversations in the file{not_json}")
    return conversations


def _conversation(data, where: str) -> list[dict]:
    if not isinstance(data, dict):
        raise TrainingDataError(f"{where}: a JSON object with 'messages' or 'conversations' expected")
    if isinstance(data.get("messages"), list):
        turns, role_key, text_key = data["messages"], "role", "content"
    elif isinstance(data.get("conversations"), list):
        turns, role_key, text_key = data["conversations"], "from", "value"
    else:
        raise TrainingDataError(f"{where}: no 'messages' (or ShareGPT 'conversations') list")
    out = []
    for turn in turns:
        role = turn.get(role_key) if isinstance(turn, dict) else None
        if role not in ROLES:
            raise TrainingDataError(f"{where}: turn {len(out) + 1} has role {role!r}; expected one of "
                                    f"{', '.join(ROLES)}")
        if not isinstance(turn.get(text_key), str):
            raise TrainingDataError(f"{where}: turn {len(out) + 1} has no text in {text_key!r}")
        out.append({"role": ROLES[role], "content": turn[text_key]})
    if not any(t["role"] == "assistant" for t in out[1:]):
        raise TrainingDataError(f"{where}: no assistant turn after a user turn: nothing to learn from")
    return out


def chat_file_records(tokenizer, path, max_tokens: int, thinking: bool = False) -> tuple[list[dict], dict]:
    """Training records of one chats file, and its counts: conversations, records, and replies left out because
    their prompt leaves under 32 of max_tokens for them (or the template does not split at the reply)."""
    conversations = read_chats(path)
    records, dropped = [], 0
    for n, turns in enumerate(conversations):
        for i, turn in enumerate(turns):
            if turn["role"] != "assistant" or i == 0:
                continue
            record = turns_record(tokenizer, f"chats/{Path(path).name}/{n}/{i}", turns[:i], turn, max_tokens,
                                  thinking)
            # fewer than 2 reply tokens leave no anchor (a root and a token after it are needed)
            if record is None or len(record["response_ids"]) < 2:
                dropped += 1
            else:
                records.append(record)
    return records, {"conversations": len(conversations), "records": len(records), "dropped": dropped}
