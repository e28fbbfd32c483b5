// OpenAI's function-calling guide with the Node SDK (its get_weather tool, strict), run by
// tests/test_serve_tools.py against `loopchat serve` through OPENAI_BASE_URL and
// OPENAI_API_KEY alone. The tool is required (a 135M model's "auto" answers as often as it
// calls), one call; the stream helper's final completion too. Prints both as JSON.
import OpenAI from "openai";

const openai = new OpenAI();

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Get current temperature for a given location.",
      parameters: {
        type: "object",
        properties: {
          location: { type: "string", description: "City and country e.g. Bogotá, Colombia" },
        },
        required: ["location"],
        additionalProperties: false,
      },
      strict: true,
    },
  },
];
const ask = {
  model: "gpt-4.1",
  messages: [{ role: "user", content: "What is the weather like in Paris today?" }],
  tools,
  tool_choice: "required",
  parallel_tool_calls: false,
};

const completion = await openai.chat.completions.create(ask);
const streamed = await openai.chat.completions.stream(ask).finalChatCompletion();
console.log(
  JSON.stringify({
    blocking: completion.choices[0].message.tool_calls,
    finish: completion.choices[0].finish_reason,
    streamed: streamed.choices[0].message.tool_calls,
  }),
);
