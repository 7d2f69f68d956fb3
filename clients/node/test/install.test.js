// Installing the client the README's way, into another npm project, then using it against a real
// daemon: `npm install <dir>` (npm links the directory; the package's postinstall installs its
// dependencies there) and `npm install --install-links --ignore-scripts <dir>` (a copy, no script).
// Both from a copy of clients/node with no node_modules and no repository around it, as a fresh
// clone's would be before anything ran there.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cpSync, existsSync, lstatSync, mkdirSync, realpathSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { promisify } from 'node:util';
import * as h from './helpers.js';

const run = promisify(execFile);
const { npm } = h;

// The README's own example, run in the project: the package by name, a session, a tool call.
const PROGRAM = `
import { Client, ResponsesAdapter } from '@corral/client';
const client = new Client();
const session = await client.openSession({ cwd: process.argv[2] });
const file = await session.readFile('hello.txt');
const item = await new ResponsesAdapter(session).handle({ type: 'function_call', name: 'list_dir', arguments: '{"dir_path":"."}', call_id: 'c1' });
console.log(JSON.stringify({ text: file.text, output: item.output }));
await session.close(); client.close();
`;

let daemon;
let base;
let ws;
let source;
before(async () => {
  daemon = await h.startDaemon();
  base = h.makeWorkspace();
  ws = h.makeWorkspace({ 'hello.txt': 'hi\n' });
  // What a clone has in clients/node: no node_modules.
  source = join(base, 'corral', 'clients', 'node');
  cpSync(h.PACKAGE_ROOT, source, {
    recursive: true,
    filter: (p) => !p.startsWith(join(h.PACKAGE_ROOT, 'node_modules')) && !p.startsWith(join(h.PACKAGE_ROOT, 'test')),
  });
});
after(async () => {
  await daemon?.stop();
  h.removeWorkspace(base);
  h.removeWorkspace(ws);
});

async function project(name, installArgs) {
  const dir = join(base, name);
  mkdirSync(dir);
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name, private: true, type: 'module' }));
  await npm(['install', '--no-audit', '--no-fund', ...installArgs], { cwd: dir });
  writeFileSync(join(dir, 'main.mjs'), PROGRAM);
  const { stdout } = await run(process.execPath, ['main.mjs', ws], {
    cwd: dir,
    env: { ...process.env, CORRAL_SOCKET: daemon.address },
  });
  return { dir, result: JSON.parse(stdout) };
}

const expected = () => ({ text: 'L1: hi', output: `Absolute path: ${ws}/.\nhello.txt` });

test('npm install <dir>: a link, its dependencies installed beside it, protos found', async () => {
  assert.equal(existsSync(join(source, 'node_modules')), false);
  const { dir, result } = await project('linked', [source]);
  assert.deepEqual(result, expected());
  assert.ok(lstatSync(join(dir, 'node_modules', '@corral', 'client')).isSymbolicLink());
  assert.equal(realpathSync(join(dir, 'node_modules', '@corral', 'client')), realpathSync(source));
  // Production dependencies only, from the lock file.
  assert.ok(existsSync(join(source, 'node_modules', '@grpc', 'grpc-js', 'package.json')));
  assert.equal(existsSync(join(source, 'node_modules', 'typescript')), false);
});

test('npm install --install-links --ignore-scripts <dir>: a copy that needs no script', async () => {
  const { dir, result } = await project('copied', ['--install-links', '--ignore-scripts', source]);
  assert.deepEqual(result, expected());
  const installed = join(dir, 'node_modules', '@corral', 'client');
  assert.equal(lstatSync(installed).isSymbolicLink(), false);
  assert.ok(existsSync(join(installed, 'proto', 'corral', 'v1', 'corral.proto')));
});

test("the package's proto copy is the repository's (its prepare script, which npm ci ran, syncs it)", async () => {
  await run(process.execPath, [join(h.PACKAGE_ROOT, 'scripts', 'copy-protos.mjs'), '--check']);
});
