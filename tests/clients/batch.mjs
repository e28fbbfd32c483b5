// OpenAI's Batch API guide with the Node SDK, run by tests/test_serve_batches.py against `loopchat
// serve` through OPENAI_BASE_URL and OPENAI_API_KEY alone: a file of two requests uploaded (the
// guide's fs.createReadStream), the batch created, retrieved until it is done, its output read.
// Prints the batch's status, counts and each output line's custom_id and reply as JSON.
import fs from "fs";
import os from "os";
import path from "path";
import OpenAI from "openai";

const openai = new OpenAI();

const lines = ["a", "b"].map((id) =>
  JSON.stringify({
    custom_id: `request-${id}`,
    method: "POST",
    url: "/v1/chat/completions",
    body: { model: "gpt-4o-mini", messages: [{ role: "user", content: "Name a colour." }], max_tokens: 6 },
  }),
);
const input = path.join(fs.mkdtempSync(path.join(os.tmpdir(), "batch-")), "batchinput.jsonl");
fs.writeFileSync(input, lines.join("\n") + "\n");

const file = await openai.files.create({ file: fs.createReadStream(input), purpose: "batch" });
let batch = await openai.batches.create({
  input_file_id: file.id,
  endpoint: "/v1/chat/completions",
  completion_window: "24h",
});
while (!["completed", "failed", "cancelled"].includes(batch.status)) {
  await new Promise((resolve) => setTimeout(resolve, 50));
  batch = await openai.batches.retrieve(batch.id);
}
const output = await (await openai.files.content(batch.output_file_id)).text();
const replies = output
  .trim()
  .split("\n")
  .map((l) => JSON.parse(l))
  .map((o) => [o.custom_id, o.response.body.choices[0].message.content]);
console.log(JSON.stringify({ status: batch.status, counts: batch.request_counts, replies }));
