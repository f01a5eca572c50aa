"""DART's node budget: the automatic budget, chosen as the run goes for the most expected tokens per second
(`auto`: `AutoBudget`), what a step would have accepted under every budget, read off its candidate pool, and the rate
formula (`pool`), and the budget as a step records it (`step_budget`). It reads the machine's cost curve and the
search's candidates; the proposers and the trace read it."""
