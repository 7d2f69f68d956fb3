// Test harness: a real `corral serve` on a temporary Unix socket, temporary workspaces, the shared
// transcript fixture.
import { execFile, spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, realpathSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { Client } from '../src/index.js';

export const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const REPO_ROOT = resolve(PACKAGE_ROOT, '..', '..');
export const FIXTURE = join(REPO_ROOT, 'clients', 'fixtures', 'transcript.json');
export const PLACEHOLDER = '@WORKSPACE@';

/** The corral binary: $CORRAL_BIN, else target/debug/corral (built with cargo if missing). */
export function corralBin() {
  if (process.env.CORRAL_BIN) return process.env.CORRAL_BIN;
  const bin = join(REPO_ROOT, 'target', 'debug', 'corral');
  if (!existsSync(bin)) {
    const r = spawnSync('cargo', ['build'], { cwd: REPO_ROOT, stdio: ['ignore', 'inherit', 'inherit'] });
    if (r.status !== 0 || !existsSync(bin)) throw new Error(`cargo build failed (status ${r.status})`);
  }
  return bin;
}

/** Runs npm (the one `npm test` was started with, else the one on PATH); resolves to {stdout, stderr}. */
export function npm(args, opts = {}) {
  const cli = process.env.npm_execpath;
  const [cmd, pre] = cli && existsSync(cli) && cli.endsWith('.js') ? [process.execPath, [cli]] : ['npm', []];
  return promisify(execFile)(cmd, [...pre, ...args], { maxBuffer: 16 << 20, ...opts });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Where the test daemons keep their state (socket, log) and where the tests put directories
 * outside every writable root: never under /tmp, which is a writable root of workspace-write
 * sessions (the daemon refuses a session whose writable root contains its state), nor under the
 * repository, which may itself be a clone under /tmp. $XDG_RUNTIME_DIR when it is set (and not
 * under /tmp), else /var/tmp.
 */
export function stateBase() {
  const underTmp = (p) => p === '/tmp' || p.startsWith('/tmp/') || p === tmpdir() || p.startsWith(`${tmpdir()}/`);
  for (const candidate of [process.env.XDG_RUNTIME_DIR, '/var/tmp']) {
    if (!candidate) continue;
    let real;
    try {
      real = realpathSync(candidate);
      if (!statSync(real).isDirectory()) continue;
    } catch {
      continue;
    }
    if (!underTmp(real)) return real;
  }
  throw new Error('no directory for the test daemons outside /tmp: set XDG_RUNTIME_DIR or create /var/tmp');
}

const privateDirs = new Set();
process.once('exit', () => {
  for (const d of privateDirs) rmSync(d, { recursive: true, force: true });
});

/** A fresh private (0700) directory under stateBase(); removed at exit if not before. */
export function privateDir(prefix = 'corral-node-') {
  const dir = mkdtempSync(join(stateBase(), prefix));
  privateDirs.add(dir);
  return dir;
}

/** Removes a privateDir(). */
export function removePrivateDir(dir) {
  rmSync(dir, { recursive: true, force: true });
  privateDirs.delete(dir);
}

/**
 * Starts a daemon. Its state (socket, log) lives in a privateDir(), never under /tmp or the
 * repository, so workspace-write sessions keep /tmp writable wherever the checkout is. On a TCP
 * port it serves plain TCP (--insecure-loopback-tcp) unless `tls` (its config says how);
 * `clientOptions`: how to reach it when ready.
 */
export async function startDaemon({ tcpPort, extraArgs = [], tls = false, clientOptions = {} } = {}) {
  const dir = privateDir('corral-node-daemon-');
  const socket = join(dir, 'corral.sock');
  const logPath = join(dir, 'daemon.log');
  const log = openSync(logPath, 'w');
  const listen = tcpPort ? `tcp:127.0.0.1:${tcpPort}` : `unix:${socket}`;
  // Plain TCP carries no caller identity; the daemon serves it only when told so explicitly.
  const args = ['serve', '--listen', listen, ...(tcpPort && !tls ? ['--insecure-loopback-tcp'] : []), ...extraArgs];
  const proc = spawn(corralBin(), args, { stdio: ['ignore', 'ignore', log] });
  closeSync(log);
  const reap = () => proc.kill('SIGKILL');
  process.once('exit', reap);
  let exited = false;
  const exitPromise = new Promise((r) => proc.once('exit', () => { exited = true; r(); }));
  const deadline = Date.now() + 20_000;
  while (!tcpPort && !existsSync(socket)) {
    if (exited || Date.now() > deadline) {
      throw new Error(`daemon did not start; log:\n${readFileSync(logPath, 'utf8')}`);
    }
    await sleep(20);
  }
  const address = tcpPort ? listen : `unix:${socket}`;
  for (;;) {
    const probe = new Client(address, clientOptions);
    try {
      await probe.waitForReady(1_000);
      break;
    } catch (err) {
      if (exited || Date.now() > deadline) {
        throw new Error(`daemon not ready (${err.message}); log:\n${readFileSync(logPath, 'utf8')}`);
      }
    } finally {
      probe.close();
    }
  }
  return {
    socket,
    address,
    dir,
    log: () => readFileSync(logPath, 'utf8'),
    async stop() {
      if (!exited) {
        proc.kill('SIGTERM');
        const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000);
        await exitPromise;
        clearTimeout(timer);
      }
      process.removeListener('exit', reap);
      removePrivateDir(dir);
    },
  };
}

/** A free loopback TCP port. */
export async function freePort() {
  const { createServer } = await import('node:net');
  return new Promise((res, rej) => {
    const srv = createServer();
    srv.once('error', rej);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => res(port));
    });
  });
}

/** A fresh workspace with the given files (relative path → content); returns its canonical path. */
export function makeWorkspace(files = {}) {
  const ws = realpathSync(mkdtempSync(join(tmpdir(), 'corral-node-ws-')));
  for (const [rel, content] of Object.entries(files)) {
    const p = join(ws, rel);
    mkdirSync(dirname(p), { recursive: true });
    writeFileSync(p, content);
  }
  return ws;
}

export function removeWorkspace(ws) {
  rmSync(ws, { recursive: true, force: true });
}

/** Replaces the workspace placeholder everywhere in a JSON-like value. */
export function substitute(value, ws) {
  if (typeof value === 'string') return value.split(PLACEHOLDER).join(ws);
  if (Array.isArray(value)) return value.map((v) => substitute(v, ws));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, ws)]));
  }
  return value;
}

/** The only run-dependent numbers in the model text: wall times. */
export function normalize(text) {
  return text
    .replace(/"duration_seconds":[0-9.eE+-]+/g, '"duration_seconds":0.0')
    .replace(/Wall time: [0-9.]+ seconds/g, 'Wall time: 0 seconds');
}

/** The item with its output normalised (output items and chat tool messages alike). */
export function normalizeItem(item) {
  if (!item) return item;
  const out = { ...item };
  if (typeof out.output === 'string') out.output = normalize(out.output);
  if (typeof out.content === 'string') out.content = normalize(out.content);
  return out;
}

export function loadFixture() {
  return JSON.parse(readFileSync(FIXTURE, 'utf8'));
}

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

/** The fixture's session settings (snake_case OpenSessionRequest fields) for Client.openSession. */
export function sessionSettings(fixture, ws) {
  const settings = { cwd: ws };
  for (const [k, v] of Object.entries(substitute(fixture.session ?? {}, ws))) settings[camel(k)] = v;
  return settings;
}

/** Whether the daemon wires apply_patch through Invoke yet (probes with an empty patch). */
export async function applyPatchSupported(session) {
  const r = await session.invoke('apply_patch', '*** Begin Patch\n*** End Patch\n', { freeform: true, callId: 'probe' });
  return !r.output.startsWith('unsupported call: apply_patch');
}
