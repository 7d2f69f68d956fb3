// session.processes against a real daemon: pipes and TTY processes, following output to its end,
// resuming from a cursor on a brand-new client, retention gaps counted from the offsets, errors.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { constants as osConstants, tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Client, Follower, InvalidArgumentError, NotFoundError, ResourceExhaustedError } from '../src/index.js';
import * as h from './helpers.js';

const ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };
const MIB = 1024 * 1024;

/** Consumes chunks from `follower` until their text contains `needle`. */
async function readUntil(follower, needle, limit = 200) {
  let text = '';
  for await (const chunk of follower) {
    text += chunk.data.toString();
    if (text.includes(needle)) return text;
    if (--limit === 0) break;
  }
  throw new Error(`${JSON.stringify(needle)} never came; got ${JSON.stringify(text)}`);
}

async function collect(follower) {
  const chunks = [];
  for await (const c of follower) chunks.push(c);
  return chunks;
}

const concat = (chunks) => Buffer.concat(chunks.map((c) => c.data));

describe('processes', () => {
  let daemon;
  let client;
  let ws;
  let session;
  before(async () => {
    daemon = await h.startDaemon();
    client = new Client(`unix:${daemon.socket}`, { deadlineMs: 60_000 });
    ws = h.makeWorkspace({});
    session = await client.openSession({ cwd: ws, mode: 'workspace-write', excludeSlashTmp: true, env: { ...ENV, HOME: ws } });
  });
  after(async () => {
    await session?.close();
    client?.close();
    await daemon?.stop();
    if (ws) h.removeWorkspace(ws);
  });

  test('a pipe process takes stdin and is followed to its end', async () => {
    const proc = await session.processes.start({ script: 'echo start:$GREETING; tr a-z A-Z; exit 3', env: { GREETING: 'hi' } });
    assert.ok(Number.isInteger(proc.id));
    assert.equal(proc.tty, false);
    await proc.write('abc\n');
    await proc.write(Buffer.from('def\n'));
    await proc.closeStdin();
    const follower = proc.follow();
    const chunks = await collect(follower);
    assert.ok(chunks.every((c) => c.missed === 0));
    assert.equal(concat(chunks).toString(), 'start:hi\nABC\nDEF\n');
    let at = 0;
    for (const c of chunks) {
      assert.equal(c.offset, at, 'offsets are contiguous');
      at += c.data.length;
    }
    assert.deepEqual(follower.cursor, { seq: chunks.at(-1).seq, offset: 17 });
    assert.equal(follower.done, true);
    assert.equal(follower.missedBytes, 0);
    assert.deepEqual(follower.state, { running: false, exitCode: 3, closed: true, outputBytes: 17 });
    assert.deepEqual(await collect(follower), [], 'a finished follower yields nothing more');
    const r = await proc.read();
    assert.equal(Buffer.concat(r.chunks.map((c) => c.data)).toString(), 'start:hi\nABC\nDEF\n');
    assert.equal(r.gap, false);
    assert.equal(r.more, false);
    assert.equal(r.lastSeq, chunks.at(-1).seq);
    const none = await proc.read({ afterSeq: r.lastSeq });
    assert.deepEqual(none.chunks, []);
    assert.equal(none.lastSeq, r.lastSeq);
    await assert.rejects(proc.write('x'), (err) => err instanceof InvalidArgumentError && /closed/.test(err.message));
    const [info] = await session.processes.list();
    assert.equal(info.id, proc.id);
    assert.equal(info.tty, false);
    assert.equal(info.escalated, false);
    assert.equal(info.state.exitCode, 3);
    assert.equal(info.command.at(-1), 'echo start:$GREETING; tr a-z A-Z; exit 3');
    const state = await proc.terminate();
    assert.equal(state.closed, true);
    assert.equal(state.running, false);
    assert.deepEqual(await session.processes.list(), []);
    await assert.rejects(proc.read(), NotFoundError);
  });

  test('a TTY process is resized and signalled', async () => {
    const proc = await session.processes.start({
      script: 'trap \'echo got-usr1\' USR1; stty size; while read l; do echo "echo:$l"; stty size; done',
      tty: true,
      rows: 30,
      cols: 100,
    });
    const follower = proc.follow({ waitMs: 500 });
    assert.match(await readUntil(follower, '30 100'), /30 100/);
    await proc.resize(40, 120);
    await proc.write('hello\n');
    assert.match(await readUntil(follower, '40 120'), /echo:hello/);
    await proc.signal('SIGUSR1');
    await readUntil(follower, 'got-usr1');
    await proc.signal('USR1');
    await readUntil(follower, 'got-usr1');
    const [info] = await session.processes.list();
    assert.equal(info.tty, true);
    assert.equal(info.state.running, true);
    // A number works too: TERM ends it, the follower runs to the end of the output.
    await proc.signal(osConstants.signals.SIGTERM);
    await collect(follower);
    assert.equal(follower.done, true);
    assert.equal(follower.missedBytes, 0);
    assert.equal(follower.state.exitCode, 128 + osConstants.signals.SIGTERM);
    await proc.terminate();
  });

  test('following resumes from a cursor on a new client', async () => {
    const expected = Array.from({ length: 300 }, (_, i) => `line${i + 1}\n`).join('');
    const first = new Client(`unix:${daemon.socket}`, { deadlineMs: 60_000 });
    // Not closed: the session must outlive this client.
    const s = await first.openSession({ cwd: ws, mode: 'read-only', env: ENV });
    const proc = await s.processes.start({ argv: ['sh', '-c', 'for i in $(seq 1 300); do echo line$i; sleep 0.002; done'] });
    let got = Buffer.alloc(0);
    const follower = proc.follow({ waitMs: 500 });
    for await (const chunk of follower) {
      got = Buffer.concat([got, chunk.data]);
      break;
    }
    // The same follower goes on where it stopped...
    for await (const chunk of follower) {
      got = Buffer.concat([got, chunk.data]);
      if (got.length > 200) break;
    }
    assert.equal(follower.cursor.offset, got.length);
    assert.equal(follower.missedBytes, 0);
    // ...and its cursor survives the client: store it, close everything, come back.
    const stored = JSON.stringify(follower.cursor);
    first.close();

    const second = new Client(`unix:${daemon.socket}`, { deadlineMs: 60_000 });
    try {
      const again = second.session(s.id);
      const resumed = again.processes.attach(proc.id).follow({ afterSeq: JSON.parse(stored) });
      const rest = concat(await collect(resumed));
      assert.equal(resumed.missedBytes, 0);
      assert.equal(resumed.state.exitCode, 0);
      assert.equal(Buffer.concat([got, rest]).toString(), expected);
      // A bare seq (no offset) resumes too.
      const bare = concat(await collect(again.processes.attach(proc.id).follow({ afterSeq: JSON.parse(stored).seq })));
      assert.equal(Buffer.concat([got, bare]).toString(), expected);
      await again.close();
      await assert.rejects(second.session(s.id).processes.list(), NotFoundError);
    } finally {
      second.close();
    }
  });

  test('a gap reports exactly how many bytes were lost', async () => {
    // 3 MiB of numbered 16-byte records; the daemon keeps the first and the last 512 KiB.
    const proc = await session.processes.start({ argv: ['seq', '-f', '%015g', '1', '196608'] });
    const state = await proc.wait({ timeoutMs: 60_000 });
    assert.equal(state.closed, true);
    assert.equal(state.exitCode, 0);
    const total = state.outputBytes;
    assert.equal(total, 3 * MIB);

    // From the start, in several reads (maxBytes), after the output closed.
    const follower = proc.follow({ maxBytes: 256 * 1024 });
    const chunks = await collect(follower);
    const data = concat(chunks);
    assert.equal(data.length, MIB);
    assert.ok(data.subarray(0, 32).equals(Buffer.from('000000000000001\n000000000000002\n')));
    assert.ok(data.subarray(-16).equals(Buffer.from('000000000196608\n')));
    const last = chunks.at(-1);
    assert.equal(last.offset + last.data.length, total);
    // One gap, between the two windows, of exactly the bytes not retained.
    const gaps = chunks.map((c, i) => [i, c.missed]).filter(([, m]) => m);
    assert.equal(gaps.length, 1);
    const [[i, missed]] = gaps;
    assert.equal(missed, total - MIB);
    assert.equal(missed, 2 * MIB);
    assert.equal(chunks[i].offset - (chunks[i - 1].offset + chunks[i - 1].data.length), missed);
    assert.equal(follower.missedBytes, missed);
    assert.equal(data.length + follower.missedBytes, total);

    // Resumed from the last chunk of the head: the loss comes first, still counted exactly.
    const headEnd = chunks[i - 1];
    const resumed = proc.follow({ afterSeq: { seq: headEnd.seq, offset: headEnd.offset + headEnd.data.length } });
    const rest = await collect(resumed);
    assert.equal(rest[0].missed, 2 * MIB);
    assert.equal(rest[0].offset, chunks[i].offset);
    assert.equal(concat(rest).length, MIB / 2);
    // From a bare seq the follower cannot know how much it missed: it says so (null).
    const bare = proc.follow({ afterSeq: headEnd.seq });
    const { value } = await bare.next();
    assert.equal(value.missed, null);
    await proc.terminate();
  });

  test('bad input is a typed error', async () => {
    const ghost = session.processes.attach(99_999_999);
    for (const call of [() => ghost.read(), () => ghost.terminate(), () => ghost.closeStdin(), () => ghost.signal('TERM')]) {
      await assert.rejects(call(), NotFoundError);
    }
    await assert.rejects(client.session('0'.repeat(32)).processes.list(), NotFoundError);
    await assert.rejects(session.processes.start({}), TypeError);
    await assert.rejects(session.processes.start({ argv: 'echo hi' }), TypeError);
    await assert.rejects(session.processes.start({ argv: ['true'], script: 'true' }), TypeError);
    await assert.rejects(session.processes.start({ argv: [] }), (err) => err instanceof InvalidArgumentError && /empty/.test(err.message));
    await assert.rejects(
      session.processes.start({ argv: ['true'], tty: true, rows: 5000 }),
      (err) => err instanceof InvalidArgumentError && /rows must be between/.test(err.message),
    );
    await assert.rejects(session.processes.start({ argv: ['true'], env: { 'A=B': 'x' } }), InvalidArgumentError);

    const proc = await session.processes.start({ argv: ['sleep', '30'] });
    try {
      await assert.rejects(proc.signal('SEGV'), (err) => err instanceof InvalidArgumentError && /use one of/.test(err.message));
      await assert.rejects(proc.signal(1.5), TypeError);
      await assert.rejects(proc.resize(10, 10), (err) => err instanceof InvalidArgumentError && /has no PTY/.test(err.message));
      await assert.rejects(proc.read({ waitMs: 60_000 }), (err) => err instanceof InvalidArgumentError && /wait at most/.test(err.message));
      await assert.rejects(proc.read({ maxBytes: 64 * MIB }), InvalidArgumentError);
      await assert.rejects(proc.write(Buffer.alloc(2 * MIB)), InvalidArgumentError);
      await assert.rejects(proc.read({ afterSeq: 2 ** 64 }), RangeError);
    } finally {
      await proc[Symbol.asyncDispose]();
    }
    assert.deepEqual(await session.processes.list(), []);
    await proc[Symbol.asyncDispose](); // already gone: fine
  });
});

test('processes hold running-command slots (RESOURCE_EXHAUSTED)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'corral-node-conf-'));
  const conf = join(dir, 'corral.toml');
  writeFileSync(conf, '[policy.default]\nmax_concurrent_commands = 1\n');
  const daemon = await h.startDaemon({ extraArgs: ['--config', conf] });
  const ws = h.makeWorkspace({});
  const c = new Client(`unix:${daemon.socket}`, { deadlineMs: 30_000 });
  try {
    const s = await c.openSession({ cwd: ws, mode: 'read-only' });
    const proc = await s.processes.start({ argv: ['sleep', '30'] });
    await assert.rejects(s.processes.start({ argv: ['sleep', '30'] }), ResourceExhaustedError);
    await proc.terminate();
    await (await s.processes.start({ argv: ['true'] })).terminate(); // the slot was freed
    await s.close();
  } finally {
    c.close();
    await daemon.stop();
    h.removeWorkspace(ws);
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a cursor between the two pieces of a cut chunk', async () => {
  // A chunk cut by the retention window comes as two pieces with one seq; a caller that stops
  // between them resumes with the second piece only. Seq 1 is "bbXXXXcc", cut to "bb" and "cc".
  const pieces = [[0, 0, 'aaaa'], [1, 4, 'bb'], [1, 10, 'cc'], [2, 12, 'dd']];
  const reads = [];
  const scripted = {
    async read({ afterSeq }) {
      reads.push(afterSeq);
      const first = afterSeq === null || afterSeq === undefined ? 0 : afterSeq + 1;
      const chunks = pieces.filter(([s]) => s >= first).map(([seq, offset, d]) => ({ seq, offset, data: Buffer.from(d) }));
      const gap = chunks.length > 0 && (chunks[0].seq !== first || chunks.some((c, i) => i > 0 && c.offset !== chunks[i - 1].offset + chunks[i - 1].data.length));
      return {
        chunks,
        gap,
        more: false,
        lastSeq: chunks.length ? chunks.at(-1).seq : afterSeq ?? null,
        state: { running: false, exitCode: 0, closed: true, outputBytes: 14 },
      };
    },
  };
  const follower = new Follower(scripted);
  const a = await follower.next();
  const b = await follower.next();
  assert.deepEqual([a.value.data.toString(), b.value.data.toString()], ['aaaa', 'bb']);
  // Seq 1 is not complete: the cursor stays on seq 0, with the offset of what was yielded.
  assert.deepEqual(follower.cursor, { seq: 0, offset: 6 });
  const resumed = new Follower(scripted, { afterSeq: follower.cursor });
  const rest = await collect(resumed);
  assert.deepEqual(rest.map((c) => [c.seq, c.offset, c.data.toString(), c.missed]), [[1, 10, 'cc', 4], [2, 12, 'dd', 0]]);
  assert.equal(resumed.missedBytes, 4);
  assert.deepEqual(resumed.cursor, { seq: 2, offset: 14 });
  assert.equal(reads.at(-1), 0);
});
