// OpenAI's embeddings guide with the Node SDK, run by tests/test_serve_embeddings.py against
// `loopchat serve` through OPENAI_BASE_URL and OPENAI_API_KEY alone: the guide's call (its
// encoding_format "float"), and the same input with the SDK's default (it asks for base64 and
// decodes it). Prints both vectors and the usage as JSON.
import OpenAI from "openai";

const openai = new OpenAI();

const embedding = await openai.embeddings.create({
  model: "text-embedding-3-small",
  input: "Your text string goes here",
  encoding_format: "float",
});
const byDefault = await openai.embeddings.create({
  model: "text-embedding-3-small",
  input: "Your text string goes here",
});
console.log(
  JSON.stringify({
    float: embedding.data[0].embedding,
    default: Array.from(byDefault.data[0].embedding),
    usage: embedding.usage,
  }),
);
