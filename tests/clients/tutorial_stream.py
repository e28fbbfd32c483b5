# OpenAI's Python SDK streaming example, as its README and tutorials show it.
# tests/test_serve_clients.py runs it unchanged against `loopchat serve`, pointed there
# by OPENAI_BASE_URL and OPENAI_API_KEY alone.
from openai import OpenAI

client = OpenAI()

stream = client.chat.completions.create(
    model="gpt-4",
    messages=[{"role": "user", "content": "Say this is a test"}],
    stream=True,
)
for chunk in stream:
    print(chunk.choices[0].delta.content or "", end="")
