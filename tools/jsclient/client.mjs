// Drives a ddflash server (its output scripted by server/jsclient_test.go)
// with the official JS OpenAI client: a tool-calling loop streamed and not,
// the reasoning split, n = 3, a json_schema reply and a penalised request.
// Usage: node client.mjs BASE_URL. Exits non-zero on the first mismatch.
import assert from "node:assert/strict";
import OpenAI from "openai";

const client = new OpenAI({ baseURL: process.argv[2] + "/v1", apiKey: "unused", maxRetries: 0 });
const model = "tiny-test";
const tools = [{
  type: "function",
  function: {
    name: "get_weather", description: "Weather in a city",
    parameters: {
      type: "object", required: ["city"],
      properties: { city: { type: "string" }, days: { type: "integer" }, metric: { type: "boolean" } },
    },
  },
}];

// chat runs a request streamed (accumulated as a client would) or not,
// and returns the choices as {content, reasoning, toolCalls, finish}.
async function chat(params, stream) {
  if (!stream) {
    const resp = await client.chat.completions.create(params);
    return resp.choices.map((c) => ({
      content: c.message.content ?? "", reasoning: c.message.reasoning_content ?? "",
      toolCalls: (c.message.tool_calls ?? []).map((t) => ({ id: t.id, name: t.function.name, arguments: t.function.arguments })),
      finish: c.finish_reason, message: c.message,
    }));
  }
  const choices = [];
  for await (const chunk of await client.chat.completions.create({ ...params, stream: true })) {
    for (const c of chunk.choices) {
      const acc = (choices[c.index] ??= { content: "", reasoning: "", toolCalls: [], finish: null });
      assert.ok(!(c.delta.content ?? "").includes("<"), `a tag leaked into content: ${c.delta.content}`);
      acc.content += c.delta.content ?? "";
      acc.reasoning += c.delta.reasoning_content ?? "";
      for (const t of c.delta.tool_calls ?? []) {
        if (!acc.toolCalls[t.index]) {
          assert.ok(t.id && t.function.name, "a call's first delta has its id and name");
          acc.toolCalls[t.index] = { id: t.id, name: t.function.name, arguments: "" };
        }
        acc.toolCalls[t.index].arguments += t.function.arguments ?? "";
      }
      if (c.finish_reason) acc.finish = c.finish_reason;
    }
  }
  for (const c of choices) {
    c.message = {
      role: "assistant", content: c.content || null,
      tool_calls: c.toolCalls.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.arguments } })),
    };
  }
  return choices;
}

for (const stream of [false, true]) {
  const messages = [{ role: "user", content: "Weather in Paris?" }];
  const [call] = await chat({ model, messages, tools, max_tokens: 200 }, stream);
  assert.equal(call.finish, "tool_calls");
  assert.equal(call.content, "Let me look.");
  assert.equal(call.reasoning, "The user wants the weather.");
  assert.equal(call.toolCalls.length, 1);
  assert.equal(call.toolCalls[0].name, "get_weather");
  assert.deepEqual(JSON.parse(call.toolCalls[0].arguments), { city: "Paris", days: 3, metric: true });

  messages.push(call.message, { role: "tool", tool_call_id: call.toolCalls[0].id, content: "sunny, 24 C" });
  const [answer] = await chat({ model, messages, tools, max_tokens: 200 }, stream);
  assert.equal(answer.finish, "stop");
  assert.equal(answer.content, "It will be sunny in Paris.");
  assert.equal(answer.reasoning, "Sunny, so no umbrella.");
  assert.equal(answer.toolCalls.length, 0);

  const three = await chat({ model, messages: [{ role: "user", content: "Pick." }], n: 3, seed: 40, max_tokens: 50 }, stream);
  assert.equal(three.length, 3);
  three.forEach((c, i) => {
    assert.equal(c.content, `answer ${40 + i}`);
    assert.equal(c.reasoning, `reason ${40 + i}`);
  });

  const schema = {
    type: "object", additionalProperties: false, required: ["name", "age"],
    properties: { name: { type: "string" }, age: { type: "integer" } },
  };
  const [person] = await chat({
    model, messages: [{ role: "user", content: "Who?" }], max_tokens: 200,
    response_format: { type: "json_schema", json_schema: { name: "person", schema, strict: true } },
  }, stream);
  assert.deepEqual(JSON.parse(person.content), { name: "Ann", age: 31 });
}

const penalised = await client.completions.create({
  model, prompt: "the fox", max_tokens: 5, presence_penalty: 0.7, frequency_penalty: 0.4,
  logit_bias: { "7": -100 }, seed: 3, repetition_penalty: 1.1, min_p: 0.05,
});
assert.equal(penalised.choices.length, 1);
console.log("ok");
