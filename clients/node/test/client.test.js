// The typed API against a real daemon: sessions, typed tool RPCs, streaming, errors.
import assert from 'node:assert/strict';
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import {
  Client,
  CorralError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  SYSTEM_SOCKET,
  checkSocket,
  defaultTarget,
  parseTarget,
} from '../src/index.js';
import * as h from './helpers.js';

const ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };

describe('parseTarget', () => {
  test('maps corral address forms to grpc-js targets', () => {
    assert.deepEqual(parseTarget('unix:/run/c.sock'), { target: 'unix:/run/c.sock', unix: true });
    assert.deepEqual(parseTarget('/run/c.sock'), { target: 'unix:/run/c.sock', unix: true });
    assert.deepEqual(parseTarget('tcp:127.0.0.1:7000'), { target: '127.0.0.1:7000', unix: false });
    assert.deepEqual(parseTarget('localhost:7000'), { target: 'localhost:7000', unix: false });
    assert.equal(parseTarget('unix:rel.sock').target, `unix:${join(process.cwd(), 'rel.sock')}`);
  });
});

/** Runs fn with process.env and process.geteuid temporarily replaced. */
function withEnv(vars, euid, fn) {
  const saved = Object.fromEntries(Object.keys(vars).map((k) => [k, process.env[k]]));
  const savedEuid = process.geteuid;
  try {
    for (const [k, v] of Object.entries(vars)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    if (euid !== undefined) process.geteuid = () => euid;
    return fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    process.geteuid = savedEuid;
  }
}

/** A listening Unix socket in a fresh directory with `mode`. */
async function socketIn(base, name, mode) {
  const dir = join(base, name);
  mkdirSync(dir);
  const path = join(dir, 's.sock');
  const server = createServer();
  await new Promise((res) => server.listen(path, res));
  chmodSync(dir, mode);
  return { server, path, dir };
}

describe('socket rule (the same as the corral CLI)', () => {
  test('CORRAL_SOCKET > own daemon if listening > system daemon; never /tmp', () => {
    const rt = mkdtempSync(join(tmpdir(), 'corral-node-rt-'));
    try {
      assert.equal(withEnv({ CORRAL_SOCKET: 'tcp:127.0.0.1:9' }, 1000, defaultTarget), 'tcp:127.0.0.1:9');
      assert.equal(withEnv({ CORRAL_SOCKET: '', XDG_RUNTIME_DIR: rt }, 1000, defaultTarget), `unix:${SYSTEM_SOCKET}`);
      mkdirSync(join(rt, 'corral'));
      writeFileSync(join(rt, 'corral', 'corral.sock'), '');
      const own = `unix:${join(rt, 'corral', 'corral.sock')}`;
      assert.equal(withEnv({ CORRAL_SOCKET: undefined, XDG_RUNTIME_DIR: rt }, 1000, defaultTarget), own);
      assert.equal(withEnv({ CORRAL_SOCKET: undefined, XDG_RUNTIME_DIR: rt }, 0, defaultTarget), `unix:${SYSTEM_SOCKET}`);
      assert.equal(withEnv({ CORRAL_SOCKET: undefined, XDG_RUNTIME_DIR: undefined }, 1000, defaultTarget), `unix:${SYSTEM_SOCKET}`);
    } finally {
      rmSync(rt, { recursive: true, force: true });
    }
  });

  test('refuses sockets in directories another user could write or owns', async () => {
    const base = mkdtempSync(join(tmpdir(), 'corral-node-sock-'));
    const servers = [];
    try {
      checkSocket(join(base, 'missing.sock'));
      for (const [name, mode] of [['own', 0o700], ['shared', 0o755]]) {
        const s = await socketIn(base, name, mode);
        servers.push(s.server);
        checkSocket(s.path);
      }
      for (const [name, mode] of [['world', 0o777], ['group', 0o770], ['sticky', 0o1777]]) {
        const s = await socketIn(base, name, mode);
        servers.push(s.server);
        assert.throws(() => checkSocket(s.path), (err) => {
          assert.ok(err instanceof PermissionDeniedError);
          assert.equal(err.code, 'PERMISSION_DENIED');
          assert.match(err.message, new RegExp(`${s.dir}.*${mode.toString(8).padStart(4, '0')}`));
          return true;
        });
        // The client refuses it before connecting.
        assert.throws(() => new Client(`unix:${s.path}`), PermissionDeniedError);
      }
      if (process.geteuid() === 0) {
        const s = await socketIn(base, 'theirs', 0o755);
        servers.push(s.server);
        chownSync(s.dir, 65534, -1);
        assert.throws(() => checkSocket(s.path), /uid 65534/);
        checkSocket(s.path, 65534);
        chownSync(s.dir, 0, -1);
        chownSync(s.path, 65534, -1);
        assert.throws(() => new Client(s.path), /impostor/);
      }
    } finally {
      for (const server of servers) server.close();
      rmSync(base, { recursive: true, force: true });
    }
  });
});

describe('against a daemon', () => {
  let daemon;
  let client;
  let ws;
  let session;
  before(async () => {
    daemon = await h.startDaemon();
    client = new Client(`unix:${daemon.socket}`, { deadlineMs: 30_000 });
    ws = h.makeWorkspace({
      'a.txt': 'alpha\nbeta\ngamma\n',
      'src/lib.rs': 'fn main() {\n    println!("hi");\n}\n',
      'src/mod/deep.rs': '// deep\n',
    });
    session = await client.openSession({ cwd: ws, mode: 'workspace-write', excludeSlashTmp: true, env: { ...ENV, HOME: ws } });
  });
  after(async () => {
    await session?.close();
    client?.close();
    await daemon?.stop();
    if (ws) h.removeWorkspace(ws);
  });

  test('capabilities', async () => {
    const caps = await client.capabilities();
    assert.equal(caps.apiVersion, 'corral.v1');
    assert.ok(caps.tools.includes('read_file'), caps.tools.join());
    assert.ok(caps.layers.length > 0);
  });

  test('session ids and writable roots', () => {
    assert.match(session.id, /^[0-9a-f]{32}$/);
    assert.ok(session.writableRoots.includes(ws), session.writableRoots.join());
  });

  test('readFile', async () => {
    const r = await session.readFile('a.txt', { offset: 2, limit: 2 });
    assert.equal(r.path, join(ws, 'a.txt'));
    assert.deepEqual(r.lines, [{ number: 2, text: 'beta' }, { number: 3, text: 'gamma' }]);
    assert.equal(r.text, 'L2: beta\nL3: gamma');
    const ind = await session.readFile('src/lib.rs', { mode: 'indentation', offset: 2, indentation: { includeSiblings: true } });
    assert.ok(ind.text.includes('L2:     println!("hi");'), ind.text);
  });

  test('readFile errors are typed', async () => {
    await assert.rejects(session.readFile('nope.txt'), (err) => {
      assert.ok(err instanceof NotFoundError);
      assert.ok(err instanceof CorralError);
      assert.equal(err.code, 'NOT_FOUND');
      // The daemon may name the path first (newer daemons do).
      assert.ok(err.message.endsWith('failed to read file: No such file or directory (os error 2)'), err.message);
      return true;
    });
    await assert.rejects(session.readFile('a.txt', { offset: 0 }), (err) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.equal(err.code, 'INVALID_ARGUMENT');
      return true;
    });
  });

  test('listDir', async () => {
    const r = await session.listDir('.', { depth: 3 });
    assert.equal(r.moreEntries, false);
    assert.deepEqual(
      r.entries.map((e) => [e.relativePath, e.kind, e.depth]),
      [
        ['a.txt', 'ENTRY_KIND_FILE', 0],
        ['src', 'ENTRY_KIND_DIRECTORY', 0],
        ['src/lib.rs', 'ENTRY_KIND_FILE', 1],
        ['src/mod', 'ENTRY_KIND_DIRECTORY', 1],
        ['src/mod/deep.rs', 'ENTRY_KIND_FILE', 2],
      ],
    );
    assert.ok(r.text.startsWith(`Absolute path: ${ws}/.\n`), r.text);
    const page = await session.listDir(ws, { limit: 1, depth: 1 });
    assert.equal(page.moreEntries, true);
    assert.equal(page.entries.length, 1);
  });

  test('grepFiles', async () => {
    const r = await session.grepFiles('println', { include: '*.rs' });
    assert.deepEqual(r.matches.map((m) => m.path), [join(ws, 'src/lib.rs')]);
    assert.ok(r.matches[0].modifiedUnixSeconds > 1_600_000_000);
    assert.equal(r.truncated, false);
    assert.equal(r.text, join(ws, 'src/lib.rs'));
    const none = await session.grepFiles('zzz_nothing_zzz');
    assert.deepEqual(none.matches, []);
    assert.equal(none.text, 'No matches found.');
  });

  test('shell: argv and script', async () => {
    const r = await session.shell(['bash', '-c', 'echo out; echo err >&2; exit 4']);
    assert.equal(r.exitCode, 4);
    assert.equal(r.success, false);
    assert.equal(r.stdout.head.toString(), 'out\n');
    assert.equal(r.stderr.head.toString(), 'err\n');
    assert.equal(r.stdout.totalBytes, 4);
    assert.ok(r.text.startsWith('{"output":'), r.text);
    const s = await session.shell('echo "$HOME"', { login: false });
    assert.equal(s.exitCode, 0);
    assert.equal(s.success, true);
    assert.equal(s.stdout.head.toString(), `${ws}\n`);
    assert.match(s.text, /^Exit code: 0\nWall time: [0-9.]+ seconds\nOutput:\n/);
    writeFileSync(join(ws, 'written-by-test.txt'), 'x');
    const w = await session.shell(['cat', 'written-by-test.txt'], { workdir: ws });
    assert.equal(w.stdout.head.toString(), 'x');
  });

  test('shell timeout', async () => {
    const r = await session.shell(['sleep', '5'], { timeoutMs: 200 });
    assert.equal(r.timedOut, true);
    assert.equal(r.exitCode, 124);
  });

  test('shellStream yields begin, ordered deltas, end', async () => {
    const events = [];
    for await (const ev of session.shellStream(['bash', '-c', 'for i in 1 2 3; do echo line$i; done'])) events.push(ev);
    assert.equal(events[0].type, 'begin');
    assert.ok(events[0].argv.includes('bash'), events[0].argv.join(' '));
    const end = events.at(-1);
    assert.equal(end.type, 'end');
    assert.equal(end.result.exitCode, 0);
    const deltas = events.filter((e) => e.type === 'delta');
    assert.deepEqual(deltas.map((d) => d.seq), deltas.map((_, i) => i));
    assert.ok(deltas.every((d) => d.stream === 'stdout'));
    assert.equal(Buffer.concat(deltas.map((d) => d.data)).toString(), 'line1\nline2\nline3\n');
  });

  test('breaking out of shellStream cancels the command', async () => {
    const started = Date.now();
    for await (const ev of session.shellStream(['bash', '-c', 'echo ready; sleep 30'])) {
      if (ev.type === 'delta') break;
    }
    assert.ok(Date.now() - started < 10_000);
  });

  test('listTools in both shapes', async () => {
    const responses = await client.listTools('responses');
    assert.ok(responses.some((t) => t.type === 'function' && t.name === 'list_dir'));
    const chat = await session.listTools('chat');
    assert.ok(chat.every((t) => t.type === 'function' && t.function.name));
    const excluded = await session.listTools('responses', { exclude: ['grep_files'] });
    assert.ok(!excluded.some((t) => t.name === 'grep_files'));
  });

  test('invoke: how a command the call ran ended', async () => {
    const r = await session.invoke('exec_command', { cmd: 'exit 3' });
    assert.deepEqual(r.command, { exitCode: 3 });
    const running = await session.invoke('exec_command', { cmd: 'sleep 5', yield_time_ms: 250 });
    assert.equal(typeof running.command.processId, 'number');
    assert.equal(running.command.exitCode, undefined);
  });

  test('invoke: object or string arguments, call id echoed', async () => {
    const r = await session.invoke('read_file', { file_path: 'a.txt', limit: 1 }, { callId: 'c1' });
    assert.deepEqual(r, { callId: 'c1', output: 'L1: alpha', success: true });
    const s = await session.invoke('read_file', '{"file_path":"a.txt","offset":3}', { callId: 'c2' });
    assert.deepEqual(s, { callId: 'c2', output: 'L3: gamma', success: true });
    const bad = await session.invoke('read_file', '{}');
    assert.equal(bad.success, false);
    assert.equal(bad.output, 'failed to parse function arguments: missing field `file_path` at line 1 column 2');
    const raw = await client.invoke({ sessionId: session.id, name: 'grep_files', arguments: { pattern: 'alpha' }, callId: 'c3' });
    assert.deepEqual(raw, { callId: 'c3', output: join(ws, 'a.txt'), success: true });
  });

  test('open errors carry the BadRequest detail', async () => {
    await assert.rejects(client.openSession({ cwd: join(ws, 'a.txt'), mode: 'read-only' }), (err) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.match(err.message, /is not a directory/);
      assert.equal(err.details[0]?.type, 'google.rpc.BadRequest', JSON.stringify(err.details));
      assert.ok(err.fieldViolations.length > 0);
      assert.equal(err.fieldViolations[0].field, 'cwd');
      return true;
    });
    await assert.rejects(
      client.openSession({ cwd: ws, mode: 'workspace-write', writableRoots: ['relative'], excludeSlashTmp: true }),
      (err) => err instanceof InvalidArgumentError && err.fieldViolations[0].field.startsWith('writable_roots'),
    );
    await assert.rejects(client.openSession({ cwd: ws, mode: 'yolo' }), TypeError);
  });

  test('close and Symbol.asyncDispose; closed sessions are NOT_FOUND', async () => {
    const s = await client.openSession({ cwd: ws, mode: 'read-only' });
    await s[Symbol.asyncDispose]();
    assert.equal(s.closed, true);
    await s.close(); // idempotent
    await assert.rejects(s.readFile('a.txt'), NotFoundError);
    await assert.rejects(client.session(s.id).close().then(() => client.session(s.id).listDir('.')), (err) => {
      assert.equal(err.code, 'NOT_FOUND');
      assert.match(err.message, /not found/);
      return true;
    });
  });

  test('a deadline cancels a slow call', async () => {
    // Whichever side notices first: the client reports DEADLINE_EXCEEDED, the server (tonic)
    // answers an expired grpc-timeout with CANCELLED. Either way the call ends at the deadline.
    const started = Date.now();
    await assert.rejects(session.shell(['sleep', '3'], { deadlineMs: 200 }), (err) => ['DEADLINE_EXCEEDED', 'CANCELLED'].includes(err.code));
    assert.ok(Date.now() - started < 2000, 'the call ended at its deadline');
  });

  test('an aborted signal cancels a call', async () => {
    const ac = new AbortController();
    const p = session.shell(['sleep', '3'], { signal: ac.signal });
    setTimeout(() => ac.abort(), 100);
    await assert.rejects(p, (err) => err.code === 'CANCELLED');
  });
});

test('TCP: tcp:HOST:PORT addresses', async () => {
  const daemon = await h.startDaemon({ tcpPort: await h.freePort() });
  const ws = h.makeWorkspace({ 'f.txt': 'one\n' });
  const c = new Client(daemon.address);
  try {
    assert.match(c.target, /^127\.0\.0\.1:\d+$/);
    const s = await c.openSession({ cwd: ws, mode: 'read-only' });
    assert.deepEqual(await s.invoke('read_file', { file_path: 'f.txt' }, { callId: 't' }), { callId: 't', output: 'L1: one', success: true });
    await s.close();
  } finally {
    c.close();
    await daemon.stop();
    h.removeWorkspace(ws);
  }
});

test('an unreachable daemon is UNAVAILABLE', async () => {
  const c = new Client('unix:/nonexistent/corral-node-test.sock');
  try {
    await assert.rejects(c.waitForReady(300), (err) => err instanceof CorralError && err.code === 'UNAVAILABLE');
    await assert.rejects(c.capabilities({ deadlineMs: 2000 }), (err) => err.code === 'UNAVAILABLE' || err.code === 'DEADLINE_EXCEEDED');
  } finally {
    c.close();
  }
});
