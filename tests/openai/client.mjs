// The official OpenAI client library against Orochi's OpenAI-compatible endpoint, serving the
// text generator (models/textgen). Usage: node client.mjs BASE_URL TOKEN
// (BASE_URL such as http://127.0.0.1:8000/v1). Each check is a node:test case.
import assert from "node:assert/strict";
import { test } from "node:test";
import OpenAI from "openai";

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60_000 });
const PROMPT = "This program is free software";
const greedy = { model: "textgen", temperature: 0, max_tokens: 120 };

test("models lists the text generator", async () => {
  const ids = [];
  for await (const model of client.models.list()) ids.push(model.id);
  assert.deepEqual(ids, ["textgen"]);
  const model = await client.models.retrieve("textgen");
  assert.equal(model.object, "model");
});

test("a completion: text, finish_reason and usage counted in bytes", async () => {
  const completion = await client.completions.create({ ...greedy, prompt: PROMPT, max_tokens: 20 });
  assert.equal(completion.object, "text_completion");
  const [choice] = completion.choices;
  assert.equal(Buffer.byteLength(choice.text), 20);
  assert.equal(choice.finish_reason, "length");
  assert.deepEqual(completion.usage, { prompt_tokens: PROMPT.length, completion_tokens: 20,
                                       total_tokens: PROMPT.length + 20 });
  const again = await client.completions.create({ ...greedy, prompt: PROMPT, max_tokens: 20 });
  assert.equal(again.choices[0].text, choice.text, "greedy decoding is deterministic");
});

test("a streamed completion arrives in chunks, before the end, the same text", async () => {
  const whole = await client.completions.create({ ...greedy, prompt: PROMPT });
  const started = performance.now();
  const stream = await client.completions.create({ ...greedy, prompt: PROMPT, stream: true,
                                                   stream_options: { include_usage: true } });
  const arrivals = [];
  let text = "";
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    arrivals.push(performance.now() - started);
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      text += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  const ended = performance.now() - started;
  assert.equal(text, whole.choices[0].text);
  assert.equal(finish, whole.choices[0].finish_reason);
  assert.deepEqual(usage, whole.usage);
  assert.ok(arrivals.length > 20, `${arrivals.length} chunks for ${text.length} characters`);
  // The first piece came while most of the text was still to be generated.
  const span = ended - arrivals[0];
  assert.ok(span > 0 && arrivals[0] < ended / 2,
            `first chunk at ${arrivals[0].toFixed(1)} ms of ${ended.toFixed(1)} ms`);
});

test("stop and seed reach the model", async () => {
  const stopped = await client.completions.create({ ...greedy, prompt: PROMPT, stop: "e" });
  assert.ok(!stopped.choices[0].text.includes("e"), stopped.choices[0].text);
  assert.equal(stopped.choices[0].finish_reason, "stop");
  const sampled = { model: "textgen", prompt: PROMPT, temperature: 1, max_tokens: 40 };
  const first = await client.completions.create({ ...sampled, seed: 5 });
  const second = await client.completions.create({ ...sampled, seed: 5 });
  assert.equal(first.choices[0].text, second.choices[0].text);
});

test("chat: one answer and a stream agree", async () => {
  const messages = [{ role: "system", content: "Licences." },
                    { role: "user", content: "Quote the GPL." }];
  const chat = await client.chat.completions.create({ ...greedy, messages, max_tokens: 60 });
  assert.equal(chat.object, "chat.completion");
  const { message } = chat.choices[0];
  assert.equal(message.role, "assistant");
  assert.ok(message.content.length > 0);
  const prompt = "system: Licences.\nuser: Quote the GPL.\nassistant: ";
  assert.equal(chat.usage.prompt_tokens, prompt.length);
  const stream = await client.chat.completions.create({ ...greedy, messages, max_tokens: 60,
                                                        stream: true });
  let content = "";
  let role = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    const { delta } = chunk.choices[0];
    if (delta.role) role = delta.role;
    content += delta.content ?? "";
  }
  assert.equal(role, "assistant");
  assert.equal(content, message.content);
  assert.ok(chunks > 10, `${chunks} chunks`);
});

test("errors come in OpenAI's shape, as the library's error classes", async () => {
  await assert.rejects(client.completions.create({ model: "missing", prompt: "x" }), (error) => {
    assert.ok(error instanceof OpenAI.NotFoundError, String(error));
    assert.equal(error.code, "model_not_found");
    assert.equal(error.param, "model");
    return true;
  });
  await assert.rejects(client.completions.create({ model: "textgen", prompt: "x", echo: true }),
                       (error) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.equal(error.param, "echo");
    assert.equal(error.type, "invalid_request_error");
    return true;
  });
  // The model's own refusal: more tokens than its context holds.
  await assert.rejects(client.completions.create({ model: "textgen", prompt: "x",
                                                   max_tokens: 100000, stream: true }),
                       (error) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.match(error.message, /max_tokens/);
    return true;
  });
  const wrongKey = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
  await assert.rejects(wrongKey.models.list(), (error) => {
    assert.ok(error instanceof OpenAI.AuthenticationError || error instanceof OpenAI.PermissionDeniedError,
              String(error));
    return true;
  });
});
