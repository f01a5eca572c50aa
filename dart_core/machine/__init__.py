"""The machine a run runs on, below the rest of the engine (it imports nothing else of it): what the machine can do
(`hardware`), the kernels measured and chosen on it for the target's linears (`kernels`), the records of where a run
ran and what was chosen there (`records`: the verify cost curve, the dtype and kernel choices, the machine record),
and the phase clock of a decoding step (`timing`)."""
