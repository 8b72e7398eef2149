// The Vercel AI SDK's `embed` and `embedMany` against a RadixChat server, through both of its
// providers a local server is used with: node ai_sdk_embed.mjs BASE_URL  (BASE_URL ends in /v1)
// Prints one JSON object: what each call returned that tests/core/api/test_ai_sdk_npm.py checks.
import { readFileSync } from "node:fs";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { cosineSimilarity, embed, embedMany } from "ai";

const [baseURL] = process.argv.slice(2);
const version = (name) =>
  JSON.parse(readFileSync(new URL(`./node_modules/${name}/package.json`, import.meta.url))).version;
// v5 names it textEmbeddingModel, v6 embeddingModel (the old name deprecated)
const embeddingModel = (provider, id) =>
  (provider.embeddingModel ?? provider.textEmbeddingModel).call(provider, id);
const norm = (vector) => Math.sqrt(vector.reduce((sum, x) => sum + x * x, 0));
const values = ["a red fox", "a blue whale"];
const out = {
  versions: Object.fromEntries(
    ["ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible"].map((name) => [name, version(name)]),
  ),
};

const providers = {
  openai: createOpenAI({ baseURL, apiKey: "unused" }),
  compatible: createOpenAICompatible({ name: "radixchat", baseURL, apiKey: "unused" }),
};
for (const [name, provider] of Object.entries(providers)) {
  const model = embeddingModel(provider, "text-embedding-3-small");
  const many = await embedMany({ model, values, maxRetries: 0 });
  const one = await embed({ model, value: values[0], maxRetries: 0 });
  out[name] = {
    count: many.embeddings.length,
    lengths: many.embeddings.map((v) => v.length),
    norms: many.embeddings.map(norm),
    tokens: many.usage.tokens,
    // the batch's first vector is the one the text gets alone
    sameAlone: cosineSimilarity(one.embedding, many.embeddings[0]),
  };
}
// `dimensions` is the openai provider's option
const short = await embed({
  model: embeddingModel(providers.openai, "text-embedding-3-small"),
  value: values[0],
  providerOptions: { openai: { dimensions: 16 } },
  maxRetries: 0,
});
out.dimensions = { length: short.embedding.length, norm: norm(short.embedding) };
console.log(JSON.stringify(out));
