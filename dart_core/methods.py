"""The one vocabulary of decoding method names, shared by the engine, the traces, the command line, the bench and
the app, and of the lanes that show them side by side (the app's cards, the HTML report, the charts)."""

from dataclasses import dataclass

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


@dataclass(frozen=True)
class LaneLook:
    """How a lane is named and drawn, wherever it is shown."""
    title: str    # a lane card's heading in the app
    short: str    # chart legends and the report's headings
    colour: str   # the card's top border and the lane's bars and lines in the charts


# A lane is keyed by the method it shows, in this order; dart_pld runs in the DART lane (lane_of).
LANES = {
    VANILLA: LaneLook("Plain decoding", "plain", "#78909c"),
    DART: LaneLook("DART", "DART", "#ef6c00"),
    PLD: LaneLook("Prompt lookup", "prompt lookup", "#7e57c2"),
}
LANE_ORDER = tuple(LANES)


def lane_of(method: str) -> str:
    """The lane a method's trace is shown in."""
    return DART if method == DART_PLD else method
