"""The same tiny model on transformers' forward and on the lean one, its steps run each way the engine runs them:
what the lean forward's tests (test_lean_forward.py) and the automatic budget's on the lean forward (test_budget.py)
decode with."""

from __future__ import annotations

from dart_core.lean_forward import EAGER, OFF
from dart_core.machine import few_rows
from dart_core.setup.tiny_models import tiny_target

NATIVE = "native"   # the C layer (dart_core.lean_native), where this machine builds it
STEPS = [NATIVE, OFF, EAGER]


def lean_pair(family: str, seed: int = 3, graphs: str = OFF):
    """The same tiny model twice: on transformers' forward, and on the lean one. graphs: NATIVE runs decode and
    verify steps in our C layer, OFF as torch operations at their own shapes, EAGER at the fixed shapes a GPU
    captures as graphs."""
    plain, lean = tiny_target(family, seed=seed), tiny_target(family, seed=seed)
    assert lean.use_lean() is None and plain.forward_kind == "transformers"
    assert lean.lean.graphs == OFF    # on a CPU, unless asked
    assert (lean.lean.native is not None) == lean.hardware.few_rows   # the C layer wherever it was built
    assert lean.forward_kind == ("lean-native" if lean.hardware.few_rows else "lean")
    if graphs == NATIVE:
        assert lean.lean.native is not None or few_rows.why_not(lean.hardware.kind)
    else:
        lean.lean.native = None
        lean.lean.graphs = graphs
    return plain, lean
