"""A recorded run replayed, from its trace alone (and its n-gram table): each drafting step with the target's
continuation after it (`replay`), why each DART step missed the token the target wanted and what each knob would have
recovered over the run (`misses`), and one step's search rerun with other knobs (`what_if`). Above the decoding core
and the node budget's candidate pool, which it reads; nothing of the core imports it."""
