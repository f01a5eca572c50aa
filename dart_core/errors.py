"""The one base class of the errors a user can cause and mend: a bad argument, a missing or broken file, a model or
head that does not fit. The command line and the app show these as one line; anything else is a bug and keeps its
traceback."""


class DartError(Exception):
    """A problem with what the user asked for or gave; the message says what is wrong and, where it can, the mend."""


class ConfigError(DartError, ValueError):
    """A setting out of range (sampling, search, generation, a knob)."""
