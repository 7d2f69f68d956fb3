// The session environment the READMEs describe (src/daemon/environment.rs): without `env`,
// commands get HOME, USER, LOGNAME and SHELL from the user's passwd entry, a system PATH and
// LANG=C.UTF-8, and nothing of the client's; `env` is merged over them entry by entry.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { after, before, test } from 'node:test';
import { Client } from '../src/index.js';
import * as h from './helpers.js';

const DEFAULT_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';

let daemon;
let client;
let ws;
before(async () => {
  daemon = await h.startDaemon();
  client = new Client(daemon.address);
  ws = h.makeWorkspace();
});
after(async () => {
  client?.close();
  await daemon?.stop();
  h.removeWorkspace(ws);
});

async function sessionEnv(settings) {
  const session = await client.openSession({ cwd: ws, ...settings });
  try {
    const r = await session.shell(['env', '-0']);
    return Object.fromEntries(r.stdout.head.toString().split('\0').filter(Boolean).map((e) => [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)]));
  } finally {
    await session.close();
  }
}

// This user's passwd entry: name, home, shell.
const [name, , , , , home, shell] = execFileSync('getent', ['passwd', String(process.geteuid())], { encoding: 'utf8' }).trim().split(':');

test("the defaults come from the user's passwd entry, not the client", async () => {
  process.env.CORRAL_CLIENT_ONLY = '1';
  try {
    const env = await sessionEnv({});
    assert.deepEqual(
      Object.fromEntries(['HOME', 'USER', 'LOGNAME', 'SHELL', 'PATH', 'LANG'].map((k) => [k, env[k]])),
      { HOME: home, USER: name, LOGNAME: name, SHELL: shell, PATH: DEFAULT_PATH, LANG: 'C.UTF-8' },
    );
    assert.equal(env.CORRAL_CLIENT_ONLY, undefined);
    assert.equal(env.TMPDIR, undefined);
  } finally {
    delete process.env.CORRAL_CLIENT_ONLY;
  }
});

test('env is merged over the defaults', async () => {
  const env = await sessionEnv({ env: { PATH: '/usr/bin:/bin', EXTRA: '1', HOME: ws } });
  assert.equal(env.PATH, '/usr/bin:/bin');
  assert.equal(env.EXTRA, '1');
  assert.equal(env.HOME, ws);
  assert.deepEqual([env.USER, env.LANG], [name, 'C.UTF-8']);
});
