// The README's example runs as written (importing the package by name) against a real daemon.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import * as h from './helpers.js';

let daemon;
let ws;
const snippet = join(h.PACKAGE_ROOT, 'test', `.readme-example-${process.pid}.mjs`);
before(async () => {
  daemon = await h.startDaemon();
  ws = h.makeWorkspace({ 'package.json': '{\n  "name": "demo",\n  "version": "1.0.0"\n}\n', 'index.js': '' });
});
after(async () => {
  rmSync(snippet, { force: true });
  await daemon?.stop();
  h.removeWorkspace(ws);
});

test('the README example works', async () => {
  const readme = readFileSync(join(h.PACKAGE_ROOT, 'README.md'), 'utf8');
  const code = readme.match(/```js\n([\s\S]*?)```/)[1];
  assert.ok(code.trim().split('\n').length <= 12, 'the example stays short');
  // Inside the package directory, so '@corral/client' resolves to this package (self-reference).
  writeFileSync(snippet, code);
  const { stdout } = await promisify(execFile)(process.execPath, [snippet], {
    cwd: ws,
    env: { ...process.env, CORRAL_SOCKET: `unix:${daemon.socket}` },
  });
  assert.ok(stdout.startsWith('L1: {\nL2:   "name": "demo",\nL3:   "version": "1.0.0"\n'), stdout);
  assert.match(stdout, new RegExp(`^\\d+ Absolute path: ${ws}/\\.\\nindex\\.js\\npackage\\.json$`, 'm'));
});

test("the README's processes example works", async () => {
  const readme = readFileSync(join(h.PACKAGE_ROOT, 'README.md'), 'utf8');
  const code = readme.split('## Processes')[1].match(/```js\n([\s\S]*?)```/)[1];
  const file = join(h.PACKAGE_ROOT, 'test', `.readme-processes-${process.pid}.mjs`);
  writeFileSync(file, code);
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [file], {
      cwd: ws,
      env: { ...process.env, CORRAL_SOCKET: `unix:${daemon.socket}` },
    });
    assert.equal(stdout, 'hello corral\n0 13\n');
  } finally {
    rmSync(file, { force: true });
  }
});
