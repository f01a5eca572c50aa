"""Files in formats other than the engine's own records: a draft head folder in either format, ours or the DART
authors' (`head_formats`), the authors' `.trie` n-gram files (`ngram_trie`), and JSON Lines, the one reader and
appender of them (`jsonl`). Above the decoding core (they read into its heads and tables); nothing of the core imports
them."""
