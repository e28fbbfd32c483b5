// OpenAI's conversation-state guide with the Node SDK, the Conversations API way, run by
// tests/test_serve_responses.py against `loopchat serve` through OPENAI_BASE_URL and OPENAI_API_KEY
// alone: a conversation made with an item, two responses that continue it, its items oldest first.
import OpenAI from "openai";

const openai = new OpenAI();

const conversation = await openai.conversations.create({
  metadata: { topic: "demo" },
  items: [{ type: "message", role: "user", content: "Hello!" }],
});
const response = await openai.responses.create({
  model: "gpt-4.1",
  input: [{ role: "user", content: "What are the 5 Ds of dodgeball?" }],
  conversation: conversation.id,
  max_output_tokens: 12,
});
await openai.responses.create({
  model: "gpt-4.1",
  input: "And the first one?",
  conversation: conversation.id,
  max_output_tokens: 6,
});
const roles = [];
for await (const item of openai.conversations.items.list(conversation.id, { order: "asc" })) {
  roles.push(item.role);
}
console.log(JSON.stringify({ conversation: conversation.id, named: response.conversation.id, roles }));
