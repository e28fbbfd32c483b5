"""The optional C extension of the sampler (src/loopchat/engine/_sampler_kernel.c): the
float64 passes over the vocabulary, fused. `optional=True`: without a C compiler the
package installs all the same and the sampler runs its numpy path (the same numbers:
tests/test_sampler_kernel.py). Everything else about the package is in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "loopchat.engine._sampler_kernel",
            ["src/loopchat/engine/_sampler_kernel.c"],
            # -fno-trapping-math lets gcc vectorise the exp's selects (no value changes);
            # -fopenmp-simd honours the loops' `omp simd` (no OpenMP runtime)
            extra_compile_args=["-O3", "-fno-trapping-math", "-fopenmp-simd"],
            optional=True,
        )
    ]
)
