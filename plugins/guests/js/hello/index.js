// js-hello: logs the size of its input and returns the input unchanged.
import { info, log, task } from '../taskhost.js';

export function describe() {
  return info({
    name: 'js-hello',
    version: '0.1.0',
    description: 'Logs the size of its input and returns it (JavaScript)',
  });
}

export const run = task((input) => {
  log.info(`hello: got ${input.length} bytes`);
  return input;
});
