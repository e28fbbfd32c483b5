// The request ids of OpenAI's Node SDK (its README, "Request IDs"), run by tests/test_serve_clients.py
// against `loopchat serve` through OPENAI_BASE_URL and OPENAI_API_KEY alone: a reply's `_request_id`,
// and an error's `requestID`. Prints both as JSON.
import OpenAI from "openai";

const client = new OpenAI({ maxRetries: 0 });

const completion = await client.chat.completions.create({
  model: "gpt-4o-mini",
  messages: [{ role: "user", content: "Say this is a test" }],
  max_tokens: 4,
});
let errorId = null;
try {
  await client.chat.completions.create({
    model: "gpt-4o-mini",
    messages: [{ role: "user", content: "Say this is a test" }],
    logprobs: true,
    top_logprobs: 30,
  });
} catch (err) {
  errorId = err.requestID;
}
console.log(JSON.stringify({ reply: completion._request_id, error: errorId }));
