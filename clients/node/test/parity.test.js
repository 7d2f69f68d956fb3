// The verbs and defaults shared with the Python client: health, the read-only default, attaching
// to a session by id (from another client), closeSession, the typed applyPatch, one error class
// per status code.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import * as corral from '../src/index.js';
import { Client, DEFAULT_MODE, NotFoundError, fromGrpcError } from '../src/index.js';
import * as h from './helpers.js';

const ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };

let daemon;
let client;
let ws;
before(async () => {
  daemon = await h.startDaemon();
  client = new Client(`unix:${daemon.socket}`, { deadlineMs: 30_000 });
  ws = h.makeWorkspace({ 'a.txt': 'one\ntwo\n' });
});
after(async () => {
  client?.close();
  await daemon?.stop();
  if (ws) h.removeWorkspace(ws);
});

test('health of the daemon and of a service', async () => {
  assert.equal(await client.health(), 'SERVING');
  assert.equal(await client.health('corral.v1.Processes'), 'SERVING');
  await assert.rejects(client.health('no.such.Service'), NotFoundError);
});

test('a session opened without a mode is read-only', async () => {
  assert.equal(DEFAULT_MODE, 'read-only');
  const session = await client.openSession({ cwd: ws, env: { ...ENV, HOME: ws } });
  try {
    const r = await session.shell(['sh', '-c', 'echo x > made.txt']);
    assert.notEqual(r.exitCode, 0, r.text);
    assert.equal(existsSync(join(ws, 'made.txt')), false);
    assert.equal((await session.readFile('a.txt')).text, 'L1: one\nL2: two');
  } finally {
    await session.close();
  }
});

test('attach to a session by id from another client, then close it by id', async () => {
  const session = await client.openSession({ cwd: ws, env: ENV });
  const other = new Client(`unix:${daemon.socket}`);
  try {
    const attached = other.session(session.id);
    assert.equal((await attached.listDir('.')).text, `Absolute path: ${ws}/.\na.txt`);
    await assert.rejects(other.session('0'.repeat(32)).listDir('.'), NotFoundError);
    await other.closeSession(session.id);
    await assert.rejects(session.readFile('a.txt'), NotFoundError);
    await assert.rejects(other.closeSession(session.id), NotFoundError);
    await session.close(); // already gone: counts as closed
  } finally {
    other.close();
  }
});

test('applyPatch, typed', async () => {
  const session = await client.openSession({ cwd: ws, mode: 'workspace-write', excludeSlashTmp: true, env: ENV });
  try {
    const r = await session.applyPatch('*** Begin Patch\n*** Add File: new.txt\n+new\n*** End Patch\n');
    assert.deepEqual(r.changes.map((c) => [c.path, c.kind]), [[join(ws, 'new.txt'), 'FILE_CHANGE_KIND_ADDED']]);
    assert.equal(readFileSync(join(ws, 'new.txt'), 'utf8'), 'new\n');
    assert.ok(r.text.includes('new.txt'), r.text);
  } finally {
    await session.close();
  }
});

test('one error class per status code, as in the Python client', () => {
  const names = Object.entries(grpc.status).filter(([name, code]) => typeof code === 'number' && name !== 'OK');
  for (const [name, code] of names) {
    const err = fromGrpcError({ code, details: 'x', metadata: new grpc.Metadata() });
    const cls = `${name.toLowerCase().replace(/(^|_)([a-z])/g, (_, __, c) => c.toUpperCase())}Error`;
    assert.equal(err.constructor.name, cls, name);
    assert.equal(corral[cls], err.constructor);
    assert.equal(err.code, name);
  }
});
