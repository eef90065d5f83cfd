// js-long: a cooperative long task.
//
// Sleeps `ms` milliseconds (param, default 1000) in steps of `step_ms`
// (default 50) with the host's cancellable sleep, reporting progress after
// each step, and ends `canceled` as soon as the host asks it to stop.
//
// With `--param mode=spin` it instead spins in JavaScript code and ignores
// cancellation, to show that the host still stops it: by force once the
// grace period or the timeout runs out.
//
// With `--param mode=nondet` it does what differs between two runs, for the
// flight recorder: it logs the wall and monotonic clocks and random bytes,
// then sleeps `steps` (default 3) random lengths of 1 to 8 ms, stopping when
// asked, and answers what it saw; with `--param fail=1` it then fails. With
// `--param trap=1` it first traps (throws outside `task()`) when a random
// byte is even; with `--param url=URL` it fetches URL (granted with
// --allow-http) and answers its status and body too; with `--param kv=1` it
// counts its runs in its slot's key-value bucket and keeps what it saw last
// there; with `--param dir=/data` (a granted directory) it first lists it
// and reads each file in it, before it may trap (built against the `task-plugin-files` world:
// JavaScript has no file API, so it calls wasi:filesystem itself).
import { Canceled, Fail, Fatal, info, isCancelled, log, param, paramInt, progress, sleep, task } from '../taskhost.js';
import { open } from 'wasi:keyvalue/store@0.2.0-draft';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft';
import { getDirectories } from 'wasi:filesystem/preopens@0.2.12';

function randomBytes(n) {
  const bytes = new Uint8Array(n);
  crypto.getRandomValues(bytes);
  return bytes;
}

// The granted directory at `path`: each entry by name, a file with its
// content, a directory with a slash.
function readDir(path) {
  const found = getDirectories().find(([, at]) => at === path);
  if (!found) throw new Fatal(`${path} is not a granted directory (submit with --dir HOST::${path})`, 2);
  const [dir] = found;
  const names = [];
  const entries = dir.readDirectory();
  for (let entry = entries.readDirectoryEntry(); entry; entry = entries.readDirectoryEntry()) {
    names.push([entry.name, entry.type]);
  }
  names.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  const decoder = new TextDecoder();
  return names
    .map(([name, type]) => {
      if (type !== 'regular-file') return `${name}/`;
      const file = dir.openAt({}, name, {}, { read: true });
      const chunks = [];
      let offset = 0n;
      for (;;) {
        const [bytes, end] = file.read(65536n, offset);
        chunks.push(decoder.decode(bytes, { stream: true }));
        offset += BigInt(bytes.length);
        if (end || bytes.length === 0) break;
      }
      return `${name}=${chunks.join('').trim()}`;
    })
    .join(' ');
}

// What `run` read of the granted directory, before it might trap (or the
// error reading it), for `nondet` to answer.
let listing = null;

async function nondet() {
  const hex = Array.from(randomBytes(8), (b) => b.toString(16).padStart(2, '0')).join('');
  let seen = `wall ${Date.now()} mono ${performance.now()} random ${hex} math ${Math.random()}`;
  log.info(seen);
  const path = param('dir');
  if (path) {
    if (listing instanceof Error) throw listing;
    seen += ` ${path}: ${listing}`;
  }
  if (param('kv')) {
    const bucket = open('');
    const runs = increment(bucket, 'runs', 1n);
    const last = bucket.get('last');
    bucket.set('last', new TextEncoder().encode(seen));
    seen += ` run ${runs}, last ${last ? last.length : 0} bytes`;
  }
  const url = param('url');
  if (url) {
    const response = await fetch(url);
    const body = await response.text();
    log.info(`${url}: ${response.status}, ${body.length} characters`);
    seen += ` ${url}: ${response.status} ${body.slice(0, 40).trim()}`;
  }
  const steps = paramInt('steps', 3);
  for (let step = 0; step < steps; step++) {
    if (isCancelled() || !sleep((randomBytes(1)[0] % 8) + 1)) {
      log.info(`stopped at step ${step}, ${Date.now()}`);
      throw new Canceled();
    }
  }
  seen += ` end ${performance.now()}`;
  if (param('fail')) throw new Fail(`failed on purpose after ${seen}`);
  return seen;
}

export function describe() {
  return info({
    name: 'js-long',
    version: '0.1.0',
    description: 'Sleeps ms (default 1000) in steps of step_ms (default 50); cancellable (JavaScript)',
  });
}

export function run(input) {
  if (param('mode') === 'nondet') {
    // The directory is read first, so that an attempt that traps below has
    // read it too (as Python's does, where the trap comes later).
    const path = param('dir');
    if (path) {
      try {
        listing = readDir(path);
        log.info(`${path}: ${listing}`);
      } catch (e) {
        listing = e;
      }
    }
    if (param('trap') && randomBytes(1)[0] % 2 === 0) {
      log.info(`trapping: a random byte was even, at ${performance.now()}`);
      // Outside `task()`, what is thrown traps the instance.
      throw new Error('trapped on purpose');
    }
  }
  return cooperative(input);
}

const cooperative = task(() => {
  const total = paramInt('ms', 1000);
  const step = paramInt('step_ms', 50);
  if (total < 0 || step <= 0) throw new Fatal('ms must be >= 0 and step_ms > 0', 2);
  if (param('mode') === 'nondet') return nondet();
  if (param('mode') === 'spin') {
    log.info('spinning; only a force-abort stops this');
    for (;;) {
      // Nothing here checks for cancellation.
    }
  }
  let done = 0;
  progress(0, total);
  while (done < total) {
    if (isCancelled()) throw new Canceled();
    const now = Math.min(step, total - done);
    if (!sleep(now)) {
      log.info(`cancelled after ${done} ms`);
      throw new Canceled();
    }
    done += now;
    progress(done, total);
  }
  return `slept ${done} ms`;
});
