// js-fanout: child tasks from JavaScript.
//
// Starts `n` children (param, default 3) of its own plugin through
// `taskhost:plugin/children`, waits for each and answers the sum of their
// outputs as JSON: {"sum": S, "children": [ids]}. A child (param `i` set)
// answers `i * i`. The keys `child-0`, `child-1`, ... make a retried parent
// find the children it started instead of starting them again.
import { spawn, wait } from 'taskhost:plugin/children@0.1.2';
import { Canceled, Fail, Fatal, info, param, paramInt, task } from '../taskhost.js';

export function describe() {
  return info({
    name: 'js-fanout',
    version: '0.1.0',
    description: 'Starts n children of itself (default 3) and sums their outputs (JavaScript)',
  });
}

export const run = task(() => {
  const i = param('i');
  if (i !== undefined) return String(Number(i) * Number(i));
  const n = paramInt('n', 3);
  const ids = [];
  for (let k = 0; k < n; k++) {
    try {
      ids.push(
        spawn({ key: `child-${k}`, params: [['i', String(k)]], input: new Uint8Array() }),
      );
    } catch (e) {
      throw new Fatal(`cannot start a child: ${e.payload ?? e}`);
    }
  }
  let sum = 0;
  for (const id of ids) {
    let outcome;
    try {
      outcome = wait(id);
    } catch (e) {
      if (e.payload === 'cancelled') throw new Canceled();
      throw new Fatal(`task ${id} is not a child of this task`);
    }
    if (outcome.status !== 'completed') {
      throw new Fail(`child ${id} did not complete: ${outcome.reason}`);
    }
    sum += Number(new TextDecoder().decode(outcome.output));
  }
  return JSON.stringify({ sum, children: ids.map(Number) });
});
