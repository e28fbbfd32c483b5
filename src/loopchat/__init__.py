"""loopchat: a terminal chat that shows the autoregressive generation loop while it runs."""

from loopchat.engine import omp_spin
from loopchat.version import __version__

__all__ = ["__version__"]

# before any loopchat module imports llama_cpp, whose library loads libgomp (omp_spin.py)
omp_spin.apply()
