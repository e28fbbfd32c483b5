"""loopchat's version, in a contract module of its own: the package's __init__ starts the engine's
OpenMP set-up (engine/omp_spin.py), so a module below the engine that read the version from the
package would import a layer above it."""

__version__ = "0.1.0"
