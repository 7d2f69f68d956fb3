// The local side of uploads and downloads, against a stand-in Files server (a grpc-js server with
// the corral.v1.Files service) that records what it gets and sends crafted streams: the upload
// stream's exact shape, a file that changes during its upload cancelling the call, a download
// written with its modes and symlinks, hostile download streams refused with nothing left behind.
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { spawnSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, beforeEach, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { CHUNK_BYTES } from '../src/files.js';
import { Client, TransferChangedError, corralPackage } from '../src/index.js';
import { makeTree, makeWritable, snapshot } from './files-helpers.js';

const SID = 's'.repeat(32);
const FILE = 'ENTRY_KIND_FILE';
const DIR = 'ENTRY_KIND_DIRECTORY';
const LINK = 'ENTRY_KIND_SYMLINK';

const standIn = { uploads: [], downloads: [], script: [] };
let server;
let base;
let client;

before(async () => {
  base = mkdtempSync(join(tmpdir(), 'corral-node-files-'));
  chmodSync(base, 0o700);
  server = new grpc.Server();
  server.addService(corralPackage().Files.service, {
    upload(call, callback) {
      const got = [];
      call.on('data', (m) => got.push(m));
      // 'end' also comes when the client cancels (followed by 'cancelled'): a moment later,
      // `call.cancelled` tells a half-closed (complete) stream from a cancelled one.
      call.on('end', () =>
        setTimeout(() => {
          const complete = !call.cancelled;
          standIn.uploads.push({ got, complete });
          const files = got.filter((m) => m.item === 'entry' && m.entry.kind === FILE).length;
          callback(null, { summary: { path: '/remote/dest', files } });
        }, 50),
      );
    },
    download(call) {
      standIn.downloads.push(call.request);
      for (const m of standIn.script) call.write(m);
      call.end();
    },
  });
  await new Promise((res, rej) =>
    server.bindAsync(`unix:${join(base, 's.sock')}`, grpc.ServerCredentials.createInsecure(), (err) => (err ? rej(err) : res())),
  );
  client = new Client(`unix:${join(base, 's.sock')}`);
});
after(async () => {
  client?.close();
  server?.forceShutdown();
  makeWritable(base);
  rmSync(base, { recursive: true, force: true });
});

let n = 0;
/** A fresh directory per test. */
function scratch() {
  const d = join(base, `t${n++}`);
  mkdirSync(d);
  return d;
}
const files = () => client.session(SID).files;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

beforeEach(() => {
  standIn.uploads.length = 0;
  standIn.downloads.length = 0;
});

const entries = (got) => got.filter((m) => m.item === 'entry').map((m) => m.entry);

function fileData(got) {
  const out = {};
  let current = null;
  const finish = got[got.length - 1];
  assert.equal(finish.item, 'finish', 'the stream ends with its finish');
  const body = got.slice(1, -1);
  const sent = { entries: 0, bytes: 0 };
  for (const m of body) {
    if (m.item === 'entry') sent.entries += 1;
    else if (m.item === 'data') sent.bytes += m.data.length;
  }
  assert.deepEqual({ entries: Number(finish.finish.entries), bytes: Number(finish.finish.bytes) }, sent);
  for (const m of body) {
    if (m.item === 'entry') {
      current = m.entry.kind === FILE ? m.entry.path : null;
      if (current !== null) out[current] = [];
    } else {
      assert.equal(m.item, 'data');
      assert.notEqual(current, null, 'data outside a file entry');
      out[current].push(m.data);
    }
  }
  return out;
}

describe('upload', () => {
  test('the stream is the tree, parents first, with modes and exact bytes', async () => {
    const dir = scratch();
    const src = makeTree(join(dir, 'src'), (5 << 20) / 2);
    spawnSync('mkfifo', [join(src, 'sub', 'pipe')]);
    const summary = await files().upload(src, 'dest', { overwrite: true, createParents: true });
    assert.deepEqual(summary.skipped, ['sub/pipe']);
    assert.equal(summary.files, 6);
    assert.equal(summary.path, '/remote/dest');
    const [{ got, complete }] = standIn.uploads;
    assert.ok(complete);
    assert.deepEqual(got[0].start, { sessionId: SID, path: 'dest', sourceName: 'src', overwrite: true, createParents: true });
    const want = snapshot(src);
    delete want['sub/pipe'];
    const data = fileData(got);
    const seen = new Set();
    const tree = {};
    for (const e of entries(got)) {
      const parent = e.path.includes('/') ? e.path.slice(0, e.path.lastIndexOf('/')) : '';
      assert.ok(e.path === '' || seen.has(parent), `${e.path} before its directory`);
      seen.add(e.path);
      if (e.kind === DIR) tree[e.path] = ['dir', e.mode];
      else if (e.kind === LINK) {
        assert.equal(e.mode, undefined);
        tree[e.path] = ['link', e.linkTarget];
      } else {
        assert.equal(e.kind, FILE);
        const chunks = data[e.path];
        assert.ok(chunks.every((c) => c.length > 0 && c.length <= CHUNK_BYTES));
        assert.equal(chunks.reduce((a, c) => a + c.length, 0), e.size);
        tree[e.path] = ['file', e.mode, Buffer.concat(chunks).toString('base64')];
      }
    }
    assert.equal(Object.keys(tree)[0], '');
    assert.deepEqual(tree, want);
    assert.equal(data['big.bin'].length, 3); // 2.5 MiB in chunks of at most 1 MiB
  });

  test('a single file and a symlink upload as roots; a FIFO is refused before calling', async () => {
    const dir = scratch();
    writeFileSync(join(dir, 'one.txt'), Buffer.from('\x00\x01binary', 'latin1'));
    chmodSync(join(dir, 'one.txt'), 0o604);
    await files().upload(join(dir, 'one.txt'), 'remote.txt');
    symlinkSync('/etc/hostname', join(dir, 'ln'));
    await files().upload(join(dir, 'ln'), 'remote-link');
    const [{ got: f }, { got: l }] = standIn.uploads;
    assert.equal(f[0].start.sourceName, 'one.txt');
    assert.deepEqual(entries(f).map((e) => [e.path, e.kind, e.mode, e.size]), [['', FILE, 0o604, 8]]);
    assert.deepEqual(Buffer.concat(fileData(f)['']), Buffer.from('\x00\x01binary', 'latin1'));
    assert.deepEqual(entries(l).map((e) => [e.path, e.kind, e.linkTarget]), [['', LINK, '/etc/hostname']]);
    spawnSync('mkfifo', [join(dir, 'fifo')]);
    await assert.rejects(files().upload(join(dir, 'fifo'), 'x'), /not a file, a directory or a symlink/);
    assert.equal(standIn.uploads.length, 2);
  });

  test('a file that grows during its upload cancels the call', async () => {
    // /proc files say size 0 and then read as text: "grew while it was being uploaded".
    await assert.rejects(files().upload('/proc/self/status', 'status'), (err) => {
      assert.ok(err instanceof TransferChangedError, String(err));
      assert.match(err.message, /grew/);
      return true;
    });
    for (let i = 0; i < 100 && standIn.uploads.length === 0; i++) await sleep(10);
    // The call was cancelled, not ended: the server never saw a complete stream.
    assert.ok(standIn.uploads.every((u) => !u.complete));
  });
});

const entry = (path, kind, { mode, size = 0, linkTarget = '' } = {}) => ({ entry: { path, kind, mode, size, linkTarget } });
const data = (s) => ({ data: Buffer.from(s) });
const SUMMARY = { summary: { path: '/remote/tree', files: 3, skipped: ['fifo'] } };

describe('download', () => {
  test('the tree is written with its modes and symlinks, atomically', async () => {
    standIn.script = [
      entry('', DIR, { mode: 0o750 }),
      entry('a.txt', FILE, { mode: 0o640, size: 6 }),
      data('hel'),
      data('lo\n'),
      entry('ro', DIR, { mode: 0o555 }),
      entry('ro/x', FILE, { mode: 0o444, size: 1 }),
      data('x'),
      entry('exe', FILE, { mode: 0o755 }),
      entry('link', LINK, { linkTarget: 'a.txt' }),
      entry('nomode', FILE),
      SUMMARY,
    ];
    const dir = scratch();
    const out = join(dir, 'out');
    const summary = await files().download('tree', out);
    assert.deepEqual(summary, { path: '/remote/tree', files: 3, directories: 0, symlinks: 0, bytes: 0, skipped: ['fifo'] });
    assert.deepEqual(standIn.downloads[0], { sessionId: SID, path: 'tree' });
    const b64 = (s) => Buffer.from(s).toString('base64');
    const want = {
      '': ['dir', 0o750],
      'a.txt': ['file', 0o640, b64('hello\n')],
      exe: ['file', 0o755, ''],
      link: ['link', 'a.txt'],
      nomode: ['file', 0o644, ''],
      ro: ['dir', 0o555],
      'ro/x': ['file', 0o444, b64('x')],
    };
    assert.deepEqual(snapshot(out), want);
    assert.deepEqual(readdirSync(dir), ['out']); // no staging left behind
    // Into an existing directory: under the remote name (cp's rule).
    await files().download('some/where/tree', out);
    assert.deepEqual(snapshot(join(out, 'tree')), want);
  });

  test('overwrite rules', async () => {
    const dir = scratch();
    const f = join(dir, 'f');
    writeFileSync(f, 'old');
    standIn.script = [entry('', FILE, { mode: 0o600, size: 3 }), data('new'), SUMMARY];
    await assert.rejects(files().download('f', f), { code: 'EEXIST' });
    assert.equal(readFileSync(f, 'utf8'), 'old');
    assert.equal(standIn.downloads.length, 0); // refused before calling
    await files().download('f', f, { overwrite: true });
    assert.equal(readFileSync(f, 'utf8'), 'new');
    // A directory by a directory (into the parent, cp's rule): replaced, not merged.
    mkdirSync(join(dir, 'd', 'old-child'), { recursive: true });
    standIn.script = [entry('', DIR, { mode: 0o700 }), entry('new-child', FILE), SUMMARY];
    await assert.rejects(files().download('remote/d', dir), { code: 'EEXIST' });
    await files().download('remote/d', dir, { overwrite: true });
    assert.deepEqual(readdirSync(join(dir, 'd')), ['new-child']);
    standIn.script = [entry('', FILE), SUMMARY];
    await assert.rejects(files().download('remote/d', dir, { overwrite: true }), { code: 'EISDIR' });
    assert.deepEqual(readdirSync(join(dir, 'd')), ['new-child']);
    assert.deepEqual(readdirSync(dir).sort(), ['d', 'f']);
  });

  const HOSTILE = {
    'parent escape': [entry('', DIR), entry('../escape', FILE), SUMMARY],
    'absolute path': [entry('', DIR), entry('/tmp/corral-hostile-abs-node', FILE), SUMMARY],
    'dot-dot inside': [entry('', DIR), entry('a', DIR), entry('a/../b', FILE), SUMMARY],
    'through its own symlink': [entry('', DIR), entry('a', LINK, { linkTarget: '../here' }), entry('a/x', FILE), SUMMARY],
    'below a file': [entry('', DIR), entry('f', FILE), entry('f/x', FILE), SUMMARY],
    'child before parent': [entry('', DIR), entry('d/x', FILE), SUMMARY],
    duplicate: [entry('', DIR), entry('a', FILE), entry('a', FILE), SUMMARY],
    'duplicate over a symlink': [entry('', DIR), entry('a', LINK, { linkTarget: '../here/x' }), entry('a', FILE), SUMMARY],
    'more bytes than announced': [entry('', FILE, { size: 2 }), data('abc'), SUMMARY],
    'fewer bytes, then an entry': [entry('', DIR), entry('a', FILE, { size: 5 }), data('ab'), entry('b', DIR), SUMMARY],
    'fewer bytes, then the end': [entry('', FILE, { size: 5 }), data('ab'), SUMMARY],
    'no summary': [entry('', DIR), entry('a', FILE)],
    'first entry not the root': [entry('a', FILE), SUMMARY],
    'data before any entry': [data('x'), entry('', FILE, { size: 1 }), SUMMARY],
    'a second root': [entry('', DIR), entry('', DIR), SUMMARY],
    'an OTHER entry': [entry('', DIR), entry('dev', 'ENTRY_KIND_OTHER'), SUMMARY],
    'a NUL in a name': [entry('', DIR), entry('a\0b', FILE), SUMMARY],
    'nothing but a summary': [SUMMARY],
    'more after the summary': [entry('', DIR), SUMMARY, entry('late', FILE)],
  };
  for (const [name, script] of Object.entries(HOSTILE)) {
    test(`a hostile stream is refused and leaves nothing: ${name}`, async () => {
      standIn.script = script;
      const dir = scratch();
      mkdirSync(join(dir, 'here'));
      await assert.rejects(files().download('tree', join(dir, 'out')));
      // Nothing beside the destination (no staging, nothing escaped to ../), nothing written
      // through a symlink the stream made, nothing at the absolute path.
      assert.deepEqual(readdirSync(dir), ['here']);
      assert.deepEqual(readdirSync(join(dir, 'here')), []);
      assert.equal(existsSync('/tmp/corral-hostile-abs-node'), false);
    });
  }
});
