// Regenerates world.d.ts from wit/task-plugin.wit with `jco guest-types`
// (the pinned @bytecodealliance/jco that componentize-js depends on).
// Run with `npm run types` in plugins/guests/js after `npm ci`.
//
// `jco guest-types` runs jco's bindings generator as a WebAssembly component
// on Node's WASI shim, and the shim version that jco 1.35.0 pulls in preopens
// no directory by default, so the plain CLI fails with "failed to read path
// for WIT ... (os error 44)". Preopening `/` first works around it.
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { _addPreopen } from './node_modules/@bytecodealliance/jco-transpile/node_modules/@bytecodealliance/preview2-shim/dist/nodejs/filesystem.js';

_addPreopen('/', '/');
const { guestTypes } = await import('./node_modules/@bytecodealliance/jco/dist/cmd/types.js');

const here = dirname(fileURLToPath(import.meta.url));
const wit = resolve(here, '../../../wit');
const jcoVersion = JSON.parse(
  await readFile(join(here, 'node_modules/@bytecodealliance/jco/package.json'), 'utf8'),
).version;
const tmp = await mkdtemp(join(tmpdir(), 'taskhost-types-'));
try {
  await guestTypes(wit, { worldName: 'task-plugin', outDir: tmp + '/', quiet: true });
  const parts = [
    'interfaces/taskhost-plugin-types.d.ts',
    'interfaces/taskhost-plugin-host.d.ts',
    'interfaces/taskhost-plugin-children.d.ts',
    'task-plugin.d.ts',
  ];
  let text =
    '// The taskhost:plugin@0.1.1 world (wit/task-plugin.wit) as seen from a componentize-js guest.\n' +
    `// Generated with: jco guest-types wit -n task-plugin (@bytecodealliance/jco ${jcoVersion}), files concatenated.\n` +
    "// Regenerate when the WIT changes (npm run types). Imports: import { sleep } from 'taskhost:plugin/host@0.1.1';\n\n";
  for (const p of parts) {
    const body = await readFile(join(tmp, p), 'utf8');
    text += body
      .split('\n')
      .filter((l) => !l.startsWith('/// <reference'))
      .join('\n');
    text += '\n';
  }
  await writeFile(join(here, 'world.d.ts'), text);
  console.log(`wrote ${join(here, 'world.d.ts')}`);
} finally {
  await rm(tmp, { recursive: true, force: true });
}
