"""The optional C extension of the sampler (src/loopchat/engine/_sampler_kernel.c): the
float64 passes over the vocabulary, fused. `optional=True`: without a C compiler the
package installs all the same and the sampler runs its numpy path (the same numbers:
tests/test_sampler_kernel.py). Everything else about the package is in pyproject.toml.

The build records the C file's sha256 in the module (`source_sha256`): a build that fails is
as silent as a missing compiler and leaves an older module in place, and tests/test_sampler_kernel.py
then says that the kernel in use is not the source's."""

import hashlib
from pathlib import Path

from setuptools import Extension, setup

SOURCE = "src/loopchat/engine/_sampler_kernel.c"
DIGEST = hashlib.sha256((Path(__file__).resolve().parent / SOURCE).read_bytes()).hexdigest()

setup(
    ext_modules=[
        Extension(
            "loopchat.engine._sampler_kernel",
            [SOURCE],
            # -fno-trapping-math lets gcc vectorise the exp's selects (no value changes);
            # -fopenmp-simd honours the loops' `omp simd` (no OpenMP runtime)
            extra_compile_args=["-O3", "-fno-trapping-math", "-fopenmp-simd"],
            define_macros=[("KERNEL_SOURCE_SHA256", f'"{DIGEST}"')],
            optional=True,
        )
    ]
)
