"""loopchat: a terminal chat that shows the autoregressive generation loop while it runs."""

__version__ = "0.1.0"
