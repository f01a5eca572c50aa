"""Training the DART draft head: training sequences with the target's features and labels, and the trainer."""
