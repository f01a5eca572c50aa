"""Hugging Face hub names, as an explicit opt-in: nothing is ever downloaded unless the user asks.

A model or head may be named by its hub id (`Qwen/Qwen3-1.7B`, `fvliang/qwen1.7b-dart`) and an n-gram file by
`repo:file` (`fvliang/dart-qwen3-ngram:small.trie`). Without the opt-in (`--hub`, or DART_LAB_HUB=1) such a name is
read from the local hub cache only, and a name not there gets a message saying what to download and where to put it.
The presets are the DART authors' released Qwen3 heads, each with its target and their shared n-gram repo.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import hf_hub_download, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError

from ..errors import DartError

HUB_ENV = "DART_LAB_HUB"
NGRAM_REPO = "fvliang/dart-qwen3-ngram"


class HubError(DartError):
    """A hub name that is not on this machine (and may not be fetched), or that the hub could not serve."""


@dataclass(frozen=True)
class Preset:
    model: str
    draft: str
    ngram: str


# The authors' released heads; small.trie loads in seconds (full.trie needs a large-memory machine).
PRESETS = {
    f"qwen3-{size}": Preset(f"Qwen/Qwen3-{size.upper()}", f"fvliang/qwen{size}-dart", f"{NGRAM_REPO}:small.trie")
    for size in ("1.7b", "4b", "8b", "14b", "32b")
}

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def allow_hub(allowed: bool = True) -> None:
    """The user's opt-in (a command's --hub): hub names may be fetched for the rest of this process."""
    os.environ[HUB_ENV] = "1" if allowed else "0"


def hub_allowed() -> bool:
    return os.environ.get(HUB_ENV) == "1"


def is_hub_id(name: str | None) -> bool:
    """`owner/name` that is not a path on this machine."""
    return bool(name) and _HUB_ID.fullmatch(name.split(":", 1)[0]) is not None and not os.path.exists(name)


def expand_preset(model: str, draft: str | None, ngram: str | None) -> tuple[str, str | None, str | None]:
    """A preset name as the model gives its target, and its head and table where those were left at 'default'."""
    preset = PRESETS.get(model)
    if preset is None:
        return model, draft, ngram
    return (preset.model, preset.draft if draft in (None, "", "default") else draft,
            preset.ngram if ngram in (None, "", "default") else ngram)


def split_file_spec(spec: str) -> tuple[str, str | None]:
    """`repo:file` -> (repo, file); `repo` -> (repo, None)."""
    repo, _, filename = spec.partition(":")
    return repo, filename or None


def fetch(spec: str, what: str) -> Path:
    """The local path of hub name `spec` (a repo, or `repo:file`): from the hub cache, or fetched when allowed.
    `what` names it in messages ("model", "draft head", "n-gram table")."""
    repo, filename = split_file_spec(spec)
    offline = not hub_allowed()
    try:
        if filename:
            return Path(hf_hub_download(repo, filename, local_files_only=offline))
        return Path(snapshot_download(repo, local_files_only=offline))
    except LocalEntryNotFoundError:
        if offline:
            get = f"hf download {repo}" + (f" {filename}" if filename else "")
            raise HubError(f"{what} {spec!r} is not on this machine and nothing is downloaded unless asked: add --hub "
                           f"(or set {HUB_ENV}=1) to fetch it, or download it yourself ({get}) into the hub cache, "
                           f"or pass a local path") from None
        raise HubError(f"{what} {spec!r}: the hub could not be reached from here; download it on a machine "
                       f"that can and pass a local path") from None
    except (HfHubHTTPError, HFValidationError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise HubError(f"{what} {spec!r} could not be fetched from the hub: {first}") from None
