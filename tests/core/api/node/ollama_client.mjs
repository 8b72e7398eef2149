// The npm `ollama` client against a RadixChat server: node ollama_client.mjs URL [PULL_NAME]
// Prints one JSON object: what each call returned that the test checks.
import { Ollama } from "ollama";

const [host, pullName] = process.argv.slice(2);
const client = new Ollama({ host });
const greedy = { temperature: 0, num_predict: 8 };
const ask = [{ role: "user", content: "What time is it in UTC?" }];
const timeTool = {
  type: "function",
  function: {
    name: "get_time",
    description: "The time in a zone",
    parameters: {
      type: "object",
      properties: { zone: { type: "string", enum: ["UTC", "CET"] } },
      required: ["zone"],
      additionalProperties: false,
    },
  },
};
const out = {};

out.version = (await client.version()).version;
out.models = (await client.list()).models.map((m) => m.model);
const shown = await client.show({ model: out.models[0] });
out.capabilities = shown.capabilities;
out.contextLength = shown.model_info["llama.context_length"];
out.running = (await client.ps()).models.map((m) => m.name);

const whole = await client.chat({ model: "tiny", messages: ask, options: greedy });
out.chat = { content: whole.message.content, done: whole.done, evalCount: whole.eval_count };
let streamed = "";
let parts = 0;
for await (const part of await client.chat({ model: "tiny", messages: ask, options: greedy, stream: true })) {
  streamed += part.message.content;
  parts += 1;
  if (part.done) out.streamedDone = part.done_reason;
}
out.streamed = { content: streamed, parts };

const forced = await client.chat({
  model: "tiny",
  messages: ask,
  tools: [timeTool],
  tool_choice: "required", // RadixChat's: the npm client passes it through
  options: { temperature: 0, num_predict: 80 },
});
out.toolCalls = (forced.message.tool_calls || []).map((c) => c.function);

const schema = {
  type: "object",
  properties: { ok: { type: "boolean" } },
  required: ["ok"],
  additionalProperties: false,
};
const json = await client.chat({
  model: "tiny",
  messages: [{ role: "user", content: "JSON please" }],
  format: schema,
  options: { temperature: 0, num_predict: 40 },
});
out.json = JSON.parse(json.message.content);

const first = await client.generate({ model: "tiny", prompt: "Once upon a time", options: greedy });
const next = await client.generate({ model: "tiny", prompt: "and", context: first.context, options: greedy });
out.context = { first: first.context.length, next: next.context.length, extends: next.context.slice(0, first.context.length).join() === first.context.join() };

const embedded = await client.embed({ model: "tiny", input: ["a cat", "a dog"] });
out.embed = embedded.embeddings.map((v) => Math.round(v.reduce((s, x) => s + x * x, 0) * 1e4) / 1e4);

try {
  await client.chat({ model: "tiny", messages: ask, think: true });
  out.thinkError = null;
} catch (error) {
  out.thinkError = { status: error.status_code, message: error.error };
}

if (pullName) {
  const statuses = [];
  for await (const status of await client.pull({ model: pullName, stream: true })) {
    statuses.push(status.status);
  }
  out.pulled = { first: statuses[0], last: statuses.at(-1), listed: (await client.list()).models.some((m) => m.model === pullName) };
  await client.delete({ model: pullName });
  out.deleted = !(await client.list()).models.some((m) => m.model === pullName);
}
console.log(JSON.stringify(out));
