"""Kept for the files that still import the tiny models from here (scripts/gpu_check.py, the training tests): they
live in dart_core.setup.tiny_models, which new code imports."""

from dart_core.setup.tiny_models import (CONFIGS, OracleDrafter, TargetDrafter, plain_greedy_reference,  # noqa: F401
                                         random_head, tiny_target)
