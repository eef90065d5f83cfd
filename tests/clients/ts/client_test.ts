// A program that drives taskhost's JSON API with types that openapi-typescript
// generated from the daemon's own `/api/openapi.json` (`api.d.ts`, beside this
// file) and nothing else: every call goes through openapi-fetch, checked by
// `tsc --strict` against those types (the route, its parameters, its request
// body), and every answer is read as the type the document gives it. If the
// document does not describe what the API does, this program does not compile
// or fails when run.
//
// tests/e2e/openapi.rs builds and runs it against a live daemon. By hand, in
// this folder after `npm ci`, with a daemon listening on `--http` (its token
// in TOKEN):
//
//     curl -H "Authorization: Bearer $TOKEN" http://127.0.0.1:PORT/api/openapi.json > openapi.json
//     npx openapi-typescript openapi.json -o api.d.ts
//     npx tsc -p tsconfig.json
//     node out/client_test.js http://127.0.0.1:PORT "$TOKEN" \
//         ../../../target/plugins/hello.wasm ../../../target/plugins/sleeper.wasm
//
// What it does, each step checked: uploads both plugins (uploadPlugin, by
// their SHA-256), submits a `hello` task (submitTask) and long-polls its
// outcome (getOutcome), submits a batch of two good tasks and one with a bad
// plugin digest (submitBatch), starts a long `sleeper`, sees its outcome is not
// there yet (getOutcome's 202) and finds it in the task list (listTasks), then
// cancels it (cancelTask) and reads its `canceled` outcome. It exits 0 when
// every answer is as expected, 1 with the mismatch otherwise.

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { basename } from "node:path";

import createClient from "openapi-fetch";

import type { operations, paths } from "./api.js";

/** The JSON body an operation takes. */
type JsonBody<Op extends keyof operations> = NonNullable<
  operations[Op]["requestBody"]
> extends { content: { "application/json": infer Body } }
  ? Body
  : never;

/** The JSON body an operation answers with `status`. */
type JsonAnswer<
  Op extends keyof operations,
  Status extends keyof operations[Op]["responses"],
> = operations[Op]["responses"][Status] extends {
  content: { "application/json": infer Body };
}
  ? Body
  : never;

type Task = JsonBody<"submitTask">;
type Submitted = JsonAnswer<"submitTask", 201>;
type Outcome = JsonAnswer<"getOutcome", 200>;

/** How many long polls of 30 s each before an outcome counts as never coming. */
const POLLS = 10;

class Mismatch extends Error {}

function expect(condition: boolean, message: string): asserts condition {
  if (!condition) {
    throw new Mismatch(message);
  }
}

/** What an answer was, for a message. */
function shown(response: Response, body: unknown): string {
  return `${response.status} ${JSON.stringify(body)?.slice(0, 500)}`;
}

const [url, token, pluginPath, sleeperPath] = process.argv.slice(2);
if (
  url === undefined ||
  token === undefined ||
  pluginPath === undefined ||
  sleeperPath === undefined
) {
  console.error(
    "usage: node client_test.js URL TOKEN HELLO_PLUGIN SLEEPER_PLUGIN",
  );
  process.exit(2);
}

const api = createClient<paths>({
  baseUrl: url,
  headers: { Authorization: `Bearer ${token}` },
});

/** Uploads the plugin at `path`; its digest (hex). */
async function upload(path: string): Promise<string> {
  const bytes = readFileSync(path);
  const digest = createHash("sha256").update(bytes).digest("hex");
  // The document's binary body is a string of octets: each byte one
  // character (latin1), sent back as those bytes.
  const { data, error, response } = await api.PUT("/api/plugins/{digest}", {
    params: { path: { digest } },
    body: bytes.toString("latin1"),
    bodySerializer: (body) => Buffer.from(body, "latin1"),
    headers: { "Content-Type": "application/octet-stream" },
  });
  expect(
    response.status === 200 && data !== undefined,
    `uploadPlugin ${basename(path)}: ${shown(response, error)}`,
  );
  expect(
    data.digest.endsWith(digest),
    `uploadPlugin ${basename(path)}: answered digest ${data.digest}, uploaded ${digest}`,
  );
  return digest;
}

/** Submits `task`; the 201 answer. */
async function submit(task: Task): Promise<Submitted> {
  const { data, error, response } = await api.POST("/api/tasks", {
    body: task,
  });
  expect(
    response.status === 201 && data !== undefined,
    `submitTask ${JSON.stringify(task)}: ${shown(response, error)}`,
  );
  expect(
    Number.isInteger(data.id) && data.name === task.name,
    `submitTask ${JSON.stringify(task)}: answered ${JSON.stringify(data)}`,
  );
  return data;
}

/** The task's result, long-polled until it has one. */
async function outcome(task: string): Promise<Outcome> {
  for (let poll = 0; poll < POLLS; poll++) {
    const { data, error, response } = await api.GET(
      "/api/tasks/{task}/outcome",
      { params: { path: { task }, query: { wait: "30s" } } },
    );
    if (response.status === 202) {
      continue;
    }
    expect(
      response.status === 200 && data !== undefined,
      `getOutcome ${task}: ${shown(response, error)}`,
    );
    // 200 and 202 share `data`: a result has attempts, a wait none.
    expect(
      "attempts" in data,
      `getOutcome ${task}: 200 without a result: ${JSON.stringify(data)}`,
    );
    return data;
  }
  throw new Mismatch(
    `getOutcome ${task}: no outcome after ${POLLS} long polls of 30s`,
  );
}

/** A completed task's result: its id, name, slot, outcome and output. */
function checkResult(
  result: Outcome,
  id: number,
  name: string,
  output: string,
): void {
  expect(
    result.id === id &&
      result.name === name &&
      result.slot === "client-ts" &&
      result.outcome === "completed" &&
      result.output === output &&
      result.output_encoding === "utf8" &&
      result.attempts === 1,
    `the outcome of ${name} (${id}): ${JSON.stringify(result)}; ` +
      `expected completed in slot client-ts with ${JSON.stringify(output)} (utf8) after 1 attempt`,
  );
}

async function run(hello: string, sleeper: string): Promise<void> {
  // One task, its outcome by long poll.
  const text = "through the generated TypeScript types";
  const submitted = await submit({
    plugin: hello,
    name: "ts-echo",
    slot: "client-ts",
    input: text,
  });
  checkResult(await outcome(String(submitted.id)), submitted.id, "ts-echo", text);

  // A batch: two tasks, and one refused in its place.
  const batch: JsonBody<"submitBatch"> = {
    tasks: [
      { plugin: hello, name: "ts-batch-1", slot: "client-ts", input: "one" },
      { plugin: hello, name: "ts-batch-2", slot: "client-ts", input: "two" },
      { plugin: "0".repeat(64), name: "ts-batch-3" },
    ],
  };
  const placed = await api.POST("/api/tasks/batch", { body: batch });
  expect(
    placed.response.status === 200 && placed.data !== undefined,
    `submitBatch: ${shown(placed.response, placed.error)}`,
  );
  const items = placed.data.items;
  expect(
    items.length === 3,
    `submitBatch: ${items.length} items for 3 tasks: ${JSON.stringify(items)}`,
  );
  const expected: [string, string][] = [
    ["ts-batch-1", "one"],
    ["ts-batch-2", "two"],
  ];
  for (const [i, [name, output]] of expected.entries()) {
    const item = items[i];
    expect(
      item !== undefined && !("error" in item) && item.name === name,
      `submitBatch: the item of ${name} is ${JSON.stringify(item)}`,
    );
    checkResult(await outcome(name), item.id, name, output);
  }
  const refused = items[2];
  expect(
    refused !== undefined &&
      "error" in refused &&
      refused.kind === "not_found" &&
      refused.error.includes("0".repeat(64)),
    `submitBatch: the item of the unknown plugin is ${JSON.stringify(refused)}, not a \`not_found\` refusal`,
  );

  // A long task: no outcome yet, listed, then canceled.
  const sleeping = await submit({
    plugin: sleeper,
    name: "ts-sleeper",
    slot: "client-ts-long",
    params: { ms: "600000" },
  });
  const waiting = await api.GET("/api/tasks/{task}/outcome", {
    params: { path: { task: "ts-sleeper" }, query: { wait: "50ms" } },
  });
  // openapi-fetch's types leave out a property whose type is only `null`
  // (the 202's `outcome`): it is looked for as any property.
  expect(
    waiting.response.status === 202 &&
      waiting.data !== undefined &&
      !("attempts" in waiting.data) &&
      waiting.data.id === sleeping.id &&
      "outcome" in waiting.data &&
      waiting.data.outcome === null,
    `getOutcome of the running sleeper: ${shown(waiting.response, waiting.data ?? waiting.error)}`,
  );
  const listed = await api.GET("/api/tasks", {
    params: { query: { limit: 10 } },
  });
  expect(
    listed.response.status === 200 && listed.data !== undefined,
    `listTasks: ${shown(listed.response, listed.error)}`,
  );
  const rows = listed.data;
  expect(rows.length <= 10, `listTasks?limit=10 gave ${rows.length} rows`);
  const mine = rows.filter((row) => row.id === sleeping.id);
  expect(
    mine.length === 1 &&
      mine[0]?.name === "ts-sleeper" &&
      mine[0]?.slot === "client-ts-long",
    `listTasks: the sleeper (${sleeping.id}) is not listed once as itself: ${JSON.stringify(rows)}`,
  );
  const canceled = await api.POST("/api/tasks/{task}/cancel", {
    params: { path: { task: "ts-sleeper" } },
  });
  expect(
    canceled.response.status === 200 &&
      canceled.data !== undefined &&
      canceled.data.claimed,
    `cancelTask: ${shown(canceled.response, canceled.data ?? canceled.error)}`,
  );
  const ended = await outcome("ts-sleeper");
  expect(
    ended.id === sleeping.id && ended.outcome === "canceled",
    `the outcome of the canceled sleeper: ${JSON.stringify(ended)}`,
  );
}

try {
  const hello = await upload(pluginPath);
  const sleeper = await upload(sleeperPath);
  await run(hello, sleeper);
  console.log("client_test.js: every call answered as the document says");
} catch (e) {
  if (e instanceof Mismatch) {
    console.error(`client_test.js: MISMATCH: ${e.message}`);
  } else {
    console.error("client_test.js: FAILED:", e);
  }
  process.exit(1);
}
