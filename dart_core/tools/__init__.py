"""The command line (`python -m dart_core ...`): generate, bench, ngram build, train-data and train."""
