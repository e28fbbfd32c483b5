"""The engine layer: one thread owns the `Llama` and runs the loop (engine.py), the sampler's stages,
the thread tuner, the workers that host the engine in a thread or a process, the prompt builder.

Imports nothing from Textual and nothing from a layer above (backends, history, chat, serve, cli,
tui). Kept empty: `import loopchat.engine.omp_spin` must not load llama.cpp."""
