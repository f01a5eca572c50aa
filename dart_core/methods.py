"""The one vocabulary of decoding method names, shared by the engine, the traces, the command line, the bench and
the app."""

VANILLA, PLD, DART, DART_PLD = "vanilla", "pld", "dart", "dart_pld"
METHODS = (DART, VANILLA, PLD, DART_PLD)
DESCRIPTIONS = {
    VANILLA: "plain decoding: one token per target forward",
    PLD: "prompt lookup: copy what followed the latest earlier match of the context's last n-gram",
    DART: "DART: one draft-head forward, an n-gram-guided beam search, one tree verified per forward",
    DART_PLD: "DART plus prompt lookup's continuation as one more branch of the tree (not in the paper)",
}
HEAD_METHODS = (DART, DART_PLD)   # the methods that need a draft head (and use the n-gram table)


def uses_head(method: str) -> bool:
    return method in HEAD_METHODS
