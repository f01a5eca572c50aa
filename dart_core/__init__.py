"""DART Lab engine: lossless DART speculative decoding on transformers models, recording every step.

`dart_core.load()` is the way in from Python (dart_core.api). The modules here are the engine; `setup/` turns names
into loaded pieces, `training/` trains the draft head, and `tools/` is the command line (`dart-lab`, or
`python -m dart_core`). docs/architecture.md draws the whole.
"""

from .acceptance import SamplingConfig
from .api import Lab, Result, load
from .decoding import GenerationConfig, generate, run
from .draft_head import DraftConfig, DraftHead
from .metrics import Metrics
from .ngram import NGramModel
from .proposers import DartProposer, HeadDrafter, PromptLookupProposer, VanillaProposer
from .target import TargetModel
from .trace import StepRecord, Trace
from .tree import TokenTree
from .tree_search import SearchConfig

__all__ = ["Lab", "Result", "load", "SamplingConfig", "GenerationConfig", "generate", "run", "DraftConfig",
           "DraftHead", "Metrics", "NGramModel", "DartProposer", "HeadDrafter", "PromptLookupProposer", "VanillaProposer", "TargetModel",
           "StepRecord", "Trace", "TokenTree", "SearchConfig"]
