// Helpers for taskhost task plugins written in JavaScript (componentize-js).
//
// Copy this file (and taskhost.d.ts + world.d.ts for editor types) next to
// your plugin and build with componentize-js against the `task-plugin` world
// of wit/task-plugin.wit; see plugins/guests/docs/javascript.md. It only wraps the
// imports of `taskhost:plugin/host@0.1.2`, so everything it does can also be
// done by hand.
//
//   import { info, task, log, Fatal } from './taskhost.js';
//
//   export function describe() {
//     return info({ name: 'greet', version: '0.1.0', description: 'Greets someone' });
//   }
//
//   export const run = task((input) => {
//     const name = new TextDecoder().decode(input).trim();
//     if (!name) throw new Fatal('give me a name with --input NAME');
//     log.info(`greeting ${name}`);
//     return `hello, ${name}!\n`;
//   });
//
// What the helper hides:
//
// * `run` returns the ok value (a Uint8Array) and reports a `task-error` by
//   throwing: componentize-js uses the thrown value's own `payload` property
//   if it has one, else the thrown value itself if it is not an `Error`, as
//   the error; an `Error` without `payload` traps the instance. `Fail`,
//   `Fatal` and `Canceled` carry the right payload; `task()` also accepts a
//   string (sent as UTF-8), an ArrayBuffer, an array of bytes or
//   undefined/null (no output), and async functions.
// * Anything else thrown out of a `task()` function becomes a retryable `fail`
//   whose reason is `uncaught Name: message`, and the stack goes to the task's
//   stderr. Without `task()` it traps the instance, which the host also
//   reports as a retryable failure, with a less useful reason.
// * The WIT spells the error case `canceled` and the sleep status and the host
//   function `cancelled`. A raw `throw { tag: 'cancelled' }` traps; here
//   `Canceled`, `Cancelled`, `canceled()`, `cancelled()` and
//   `isCancelled()` all work, and `task()` fixes a thrown `tag: 'cancelled'`.
// * u64 arguments are BigInts in the bindings; `sleep` and `progress` take
//   plain numbers.
// * Top-level code runs once, at build time (componentize-js snapshots the
//   initialised engine): call host functions only inside `describe` and `run`.

import * as host from 'taskhost:plugin/host@0.1.2';

// --- errors ----------------------------------------------------------------

/** Base of the errors that end `run` with a `task-error`. */
export class TaskError extends Error {
  constructor(message, payload) {
    super(message);
    this.name = new.target.name;
    // componentize-js sends an own `payload` property as the `err` value.
    Object.defineProperty(this, 'payload', { value: payload, enumerable: true });
  }
}

function failure(reason, exitCode) {
  const val = { reason: String(reason) };
  if (exitCode !== undefined && exitCode !== null) val.exitCode = exitCode | 0;
  return val;
}

/** A failure that may go away on retry: the `fail` case. */
export class Fail extends TaskError {
  constructor(reason, exitCode) {
    super(String(reason), { tag: 'fail', val: failure(reason, exitCode) });
  }
}

/** A failure that retrying cannot fix: the `fatal` case. Never retried. */
export class Fatal extends TaskError {
  constructor(reason, exitCode) {
    super(String(reason), { tag: 'fatal', val: failure(reason, exitCode) });
  }
}

/** The task stopped because the host asked it to: the `canceled` case. */
export class Canceled extends TaskError {
  constructor(message = 'canceled') {
    super(message, { tag: 'canceled' });
  }
}

/** The same as `Canceled` (the WIT uses both spellings). */
export const Cancelled = Canceled;

export const fail = (reason, exitCode) => new Fail(reason, exitCode);
export const fatal = (reason, exitCode) => new Fatal(reason, exitCode);
export const canceled = () => new Canceled();
export const cancelled = canceled;

const TAGS = { fail: 'fail', fatal: 'fatal', canceled: 'canceled', cancelled: 'canceled' };

function normalizeTaskError(v) {
  if (v === null || typeof v !== 'object' || !(v.tag in TAGS)) return null;
  const tag = TAGS[v.tag];
  if (tag === 'canceled') return { tag };
  const val = v.val ?? {};
  return { tag, val: failure(val.reason ?? tag, val.exitCode) };
}

function toTaskError(e) {
  if (e instanceof TaskError) return e;
  // A hand-built `{ tag, val }`, thrown as is or as an error's `payload`.
  const raw =
    e !== null && typeof e === 'object' && Object.prototype.hasOwnProperty.call(e, 'payload')
      ? e.payload
      : e;
  const payload = normalizeTaskError(raw);
  if (payload) return new TaskError(payload.val?.reason ?? payload.tag, payload);
  if (e instanceof Error) {
    console.error(e.stack ? `${e.name}: ${e.message}\n${e.stack}` : String(e));
    return new Fail(`uncaught ${e.name}: ${e.message}`);
  }
  let text;
  try {
    text = typeof e === 'string' ? e : JSON.stringify(e);
  } catch {
    text = String(e);
  }
  return new Fail(`uncaught exception: ${text}`);
}

const encoder = new TextEncoder();

function toBytes(out) {
  if (out === undefined || out === null) return new Uint8Array(0);
  if (out instanceof Uint8Array) return out;
  if (typeof out === 'string') return encoder.encode(out);
  if (out instanceof ArrayBuffer) return new Uint8Array(out);
  if (ArrayBuffer.isView(out)) return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
  if (Array.isArray(out)) return Uint8Array.from(out);
  throw new Fail(`run must return bytes, a string or nothing, not ${typeof out}`);
}

/**
 * Wraps the function exported as `run`: converts its result to bytes and
 * whatever it throws to a `task-error`. Works with async functions too.
 */
export function task(fn) {
  return function run(input) {
    let out;
    try {
      out = fn(input);
    } catch (e) {
      throw toTaskError(e);
    }
    if (out !== null && typeof out === 'object' && typeof out.then === 'function') {
      return out.then(toBytes, (e) => {
        throw toTaskError(e);
      });
    }
    return toBytes(out);
  };
}

// --- describe --------------------------------------------------------------

export const readDir = (guestPath) => ({ tag: 'read-dir', val: String(guestPath) });
export const writeDir = (guestPath) => ({ tag: 'write-dir', val: String(guestPath) });
export const env = (name) => ({ tag: 'env', val: String(name) });
export const network = () => ({ tag: 'network' });

const POLICIES = new Set(['queue', 'replace', 'drop-if-running']);

/** Builds the `plugin-info` record that `describe` returns. */
export function info({
  name,
  version = '0.1.0',
  description = '',
  resource,
  policy = 'queue',
  capabilities = [],
}) {
  if (!POLICIES.has(policy)) {
    throw new TypeError(`unknown policy ${policy}: use queue, replace or drop-if-running`);
  }
  const out = { name, version, description, defaultPolicy: policy, capabilities: [...capabilities] };
  if (resource !== undefined && resource !== null) out.resource = resource;
  return out;
}

// --- host calls ------------------------------------------------------------

/** Facts of this attempt: taskId (a BigInt), name, slot, attempt (1, 2, ...), params. */
export const attempt = () => host.attempt();

/** The submission's `--param K=V` pairs as an object (the last value of a key wins). */
export const params = () => Object.fromEntries(host.attempt().params);

/** One param, or `fallback` when it was not given. */
export function param(name, fallback = undefined) {
  const p = params();
  return Object.prototype.hasOwnProperty.call(p, name) ? p[name] : fallback;
}

/** One integer param, or `fallback`. A value that is not an integer throws `Fatal`. */
export function paramInt(name, fallback) {
  const v = param(name);
  if (v === undefined) return fallback;
  if (!/^\s*[+-]?\d+\s*$/.test(v)) {
    throw new Fatal(`param ${name} must be an integer, got ${JSON.stringify(v)}`, 2);
  }
  return Number.parseInt(v, 10);
}

/** True once the host has asked this attempt to stop. */
export const isCancelled = () => host.isCancelled();

/** Throws `Canceled` if the host has asked this attempt to stop. */
export function checkCancelled() {
  if (host.isCancelled()) throw new Canceled();
}

/**
 * Sleeps `ms` milliseconds on the host, waking early on cancellation.
 * Returns true when the whole duration elapsed, false when cancellation cut
 * it short: `if (!sleep(50)) throw new Canceled();`.
 */
export function sleep(ms) {
  const n = Math.max(0, Math.trunc(Number(ms) || 0));
  return host.sleep(BigInt(n)) === 'elapsed';
}

/** Reports `done` units out of `total` (0 if unknown). */
export function progress(done, total = 0) {
  const big = (x) => BigInt(Math.max(0, Math.trunc(Number(x) || 0)));
  host.progress(big(done), big(total));
}

const LEVELS = new Set(['trace', 'debug', 'info', 'warn', 'error']);

function logAt(level, message) {
  if (!LEVELS.has(level)) throw new TypeError(`unknown log level ${level}`);
  host.log(level, String(message));
}

/** `log.info('...')` and friends: structured lines in the task's log. */
export const log = Object.assign(logAt, {
  trace: (m) => host.log('trace', String(m)),
  debug: (m) => host.log('debug', String(m)),
  info: (m) => host.log('info', String(m)),
  warn: (m) => host.log('warn', String(m)),
  error: (m) => host.log('error', String(m)),
});
