// js-long: a cooperative long task.
//
// Sleeps `ms` milliseconds (param, default 1000) in steps of `step_ms`
// (default 50) with the host's cancellable sleep, reporting progress after
// each step, and ends `canceled` as soon as the host asks it to stop.
//
// With `--param mode=spin` it instead spins in JavaScript code and ignores
// cancellation, to show that the host still stops it: by force once the
// grace period or the timeout runs out.
import { Canceled, Fatal, info, isCancelled, log, param, paramInt, progress, sleep, task } from '../taskhost.js';

export function describe() {
  return info({
    name: 'js-long',
    version: '0.1.0',
    description: 'Sleeps ms (default 1000) in steps of step_ms (default 50); cancellable (JavaScript)',
  });
}

export const run = task(() => {
  const total = paramInt('ms', 1000);
  const step = paramInt('step_ms', 50);
  if (total < 0 || step <= 0) throw new Fatal('ms must be >= 0 and step_ms > 0', 2);
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
