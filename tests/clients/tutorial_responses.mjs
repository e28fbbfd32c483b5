// OpenAI's Node SDK quickstart (the Responses API), as its README and the platform's first
// page show it. tests/test_serve_responses.py runs it unchanged against `loopchat serve`,
// pointed there by OPENAI_BASE_URL and OPENAI_API_KEY alone.
import OpenAI from "openai";

const client = new OpenAI();

const response = await client.responses.create({
  model: "gpt-5",
  input: "Write a one-sentence bedtime story about a unicorn.",
});

console.log(response.output_text);
