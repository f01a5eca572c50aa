"""Set-up: from user-level names ("default", a folder, "random", "none") to loaded models, heads, tables and prompts;
the shipped assets, the user cache and the measured defaults."""
