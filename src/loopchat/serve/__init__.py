"""`loopchat serve`: the OpenAI-compatible HTTP server over one engine."""
