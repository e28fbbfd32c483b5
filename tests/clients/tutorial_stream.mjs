// OpenAI's Node SDK streaming example, as its README and tutorials show it (only the
// model's name is the issue's). tests/test_serve_clients.py runs it unchanged against
// `loopchat serve`, pointed there by OPENAI_BASE_URL and OPENAI_API_KEY alone.
import OpenAI from "openai";

const openai = new OpenAI();

const stream = await openai.chat.completions.create({
  model: "gpt-4",
  messages: [{ role: "user", content: "Say this is a test" }],
  stream: true,
});
for await (const chunk of stream) {
  process.stdout.write(chunk.choices[0]?.delta?.content || "");
}
