// session.files against a real daemon: bytes read and written, a tree uploaded and downloaded back
// unchanged (modes, symlinks, a file bigger than one message), cp's rule, overwrite, what a
// download skips, and the sandbox's rules holding. Skipped, saying so, with a daemon built before
// the Files service.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { AlreadyExistsError, Client, CorralError, NotFoundError, TransferChangedError, UnimplementedError } from '../src/index.js';
import { makeTree, makeWritable, snapshot } from './files-helpers.js';
import * as h from './helpers.js';

const ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };
const MIB = 1024 * 1024;

let daemon;
let client;
let ws;
let local;
let session;
let served = true;
before(async () => {
  daemon = await h.startDaemon();
  client = new Client(`unix:${daemon.socket}`, { deadlineMs: 60_000 });
  ws = h.makeWorkspace({});
  local = mkdtempSync(join(tmpdir(), 'corral-node-local-'));
  session = await client.openSession({ cwd: ws, mode: 'workspace-write', excludeSlashTmp: true, env: ENV });
  try {
    await session.files.read('probe');
  } catch (err) {
    if (err instanceof UnimplementedError) served = false;
    else if (!(err instanceof NotFoundError)) throw err;
  }
});
after(async () => {
  await session?.close();
  client?.close();
  await daemon?.stop();
  for (const d of [ws, local]) {
    if (d) {
      makeWritable(d);
      rmSync(d, { recursive: true, force: true });
    }
  }
});

const SKIP = 'this daemon does not serve corral.v1.Files (built before the i12-files merge)';

describe('files against a daemon', () => {
  test('bytes read and written', async (t) => {
    if (!served) return t.skip(SKIP);
    const blob = Buffer.concat([Buffer.from([...Array(256).keys()]), Buffer.from('\x00end')]);
    const w = await session.files.write('dir/blob.bin', blob, { mode: 0o640, createParents: true });
    assert.deepEqual(w, { path: join(ws, 'dir', 'blob.bin'), size: blob.length });
    assert.deepEqual(readFileSync(join(ws, 'dir', 'blob.bin')), blob);
    assert.equal(statSync(join(ws, 'dir', 'blob.bin')).mode & 0o777, 0o640);
    assert.deepEqual(await session.files.read('dir/blob.bin'), blob);
    await session.files.write('dir/blob.bin', 'new');
    assert.equal((await session.files.read(join(ws, 'dir', 'blob.bin'))).toString(), 'new');
    assert.equal(statSync(join(ws, 'dir', 'blob.bin')).mode & 0o777, 0o640);
    await assert.rejects(session.files.write('dir/blob.bin', 'x', { overwrite: false }), AlreadyExistsError);
    await assert.rejects(session.files.read('missing.bin'), NotFoundError);
    await assert.rejects(session.files.write('no/such/dir/f', 'x'), CorralError);
  });

  test('stat, listDirectory, makeDirectory, copy and remove', async (t) => {
    if (!served) return t.skip(SKIP);
    assert.equal(await session.files.makeDirectory('ops/deep', { recursive: true }), join(ws, 'ops', 'deep'));
    assert.equal(statSync(join(ws, 'ops', 'deep')).mode & 0o777, 0o755);
    await assert.rejects(session.files.makeDirectory('ops'), AlreadyExistsError);
    await session.files.write('ops/f.txt', 'twelve bytes', { mode: 0o640 });
    const st = await session.files.stat('ops/f.txt');
    assert.deepEqual([st.path, st.kind, st.size, st.mode], [join(ws, 'ops', 'f.txt'), 'ENTRY_KIND_FILE', 12, 0o640]);
    assert.ok(st.modifiedMs > 0);
    await assert.rejects(session.files.stat('missing'), NotFoundError);
    assert.equal(await session.files.copy('ops', 'ops-copy', { recursive: true }), join(ws, 'ops-copy'));
    assert.equal(readFileSync(join(ws, 'ops-copy', 'f.txt'), 'utf8'), 'twelve bytes');
    assert.deepEqual(await session.files.listDirectory('ops-copy'), [
      { name: 'deep', kind: 'ENTRY_KIND_DIRECTORY' },
      { name: 'f.txt', kind: 'ENTRY_KIND_FILE' },
    ]);
    await assert.rejects(session.files.remove('ops-copy'), CorralError);
    assert.equal(await session.files.remove('ops-copy', { recursive: true }), join(ws, 'ops-copy'));
    assert.ok(!existsSync(join(ws, 'ops-copy')));
    await session.files.remove('ops-copy', { force: true });
  });

  test('a tree goes up and comes back unchanged', async (t) => {
    if (!served) return t.skip(SKIP);
    const src = makeTree(join(local, 'src'), 3 * MIB + 12345);
    const up = await session.files.upload(src, 'copy');
    assert.equal(up.path, join(ws, 'copy'));
    assert.deepEqual([up.files, up.directories, up.symlinks], [6, 5, 2]);
    assert.deepEqual(snapshot(join(ws, 'copy')), snapshot(src));
    const down = await session.files.download('copy', join(local, 'back'));
    assert.deepEqual([down.files, down.directories, down.symlinks, down.skipped], [6, 5, 2, []]);
    assert.deepEqual(snapshot(join(local, 'back')), snapshot(src));
  });

  test("cp's rule, overwrite, and what a download skips", async (t) => {
    if (!served) return t.skip(SKIP);
    const f = join(local, 'one.txt');
    writeFileSync(f, 'one');
    mkdirSync(join(ws, 'inbox'));
    assert.equal((await session.files.upload(f, 'inbox')).path, join(ws, 'inbox', 'one.txt'));
    await assert.rejects(session.files.upload(f, 'inbox'), AlreadyExistsError);
    writeFileSync(f, 'two');
    await session.files.upload(f, 'inbox', { overwrite: true });
    assert.equal(readFileSync(join(ws, 'inbox', 'one.txt'), 'utf8'), 'two');
    await session.files.upload(f, 'deep/er/x.txt', { createParents: true });
    assert.equal(readFileSync(join(ws, 'deep', 'er', 'x.txt'), 'utf8'), 'two');
    spawnSync('mkfifo', [join(ws, 'inbox', 'pipe')]);
    const out = join(local, 'out');
    mkdirSync(out);
    const summary = await session.files.download('inbox', out);
    assert.deepEqual(summary.skipped, ['pipe']);
    assert.deepEqual(readdirSync(join(out, 'inbox')), ['one.txt']);
    await assert.rejects(session.files.download('inbox', out), { code: 'EEXIST' });
    writeFileSync(join(ws, 'inbox', 'one.txt'), 'three');
    await session.files.download('inbox', out, { overwrite: true });
    assert.equal(readFileSync(join(out, 'inbox', 'one.txt'), 'utf8'), 'three');
  });

  test('an upload cancelled half-way changes nothing', async (t) => {
    if (!served) return t.skip(SKIP);
    // /proc files say size 0, then read as text: the upload is cancelled, the daemon commits nothing.
    const before = readdirSync(ws);
    await assert.rejects(session.files.upload('/proc/self/status', 'status'), TransferChangedError);
    // The client cancelled and went: the worker removes its staging just after.
    for (let i = 0; i < 100 && readdirSync(ws).length !== before.length; i++) await sleep(50);
    assert.deepEqual(readdirSync(ws), before);
    assert.equal((await session.files.write('after.txt', 'ok')).size, 2);
  });

  test('a read-only session reads but writes nothing; protected names stay protected', async (t) => {
    if (!served) return t.skip(SKIP);
    writeFileSync(join(ws, 'r.txt'), 'r');
    const ro = await client.openSession({ cwd: ws, env: ENV });
    try {
      assert.equal((await ro.files.read('r.txt')).toString(), 'r');
      await assert.rejects(ro.files.write('w.txt', 'w'), CorralError);
      writeFileSync(join(local, 'f'), 'f');
      await assert.rejects(ro.files.upload(join(local, 'f'), 'up.txt'), CorralError);
      assert.equal(existsSync(join(ws, 'w.txt')) || existsSync(join(ws, 'up.txt')), false);
    } finally {
      await ro.close();
    }
    mkdirSync(join(ws, '.git'));
    await assert.rejects(session.files.write('.git/config', '[core]\n'), CorralError);
    assert.equal(lstatSync(join(ws, '.git')).isDirectory() && !existsSync(join(ws, '.git', 'config')), true);
  });
});
