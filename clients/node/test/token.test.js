// Bearer tokens, as the corral CLI sends them (src/client/cli.rs `tcp_auth`, connect.rs): the token
// option or $CORRAL_TOKEN, for TCP addresses only and only over TLS, as `authorization: Bearer
// TOKEN`. Against a real daemon serving TLS itself with a [[tokens]] entry; and the friendlier
// errors of a Unix socket that is missing or refuses connections.
import assert from 'node:assert/strict';
import { execFileSync, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Client, InvalidArgumentError, UnauthenticatedError, UnavailableError } from '../src/index.js';
import * as h from './helpers.js';

const TOKEN = 'token-123';
const opensslMissing = spawnSync('openssl', ['version']).status !== 0;

let pki;
let cert;
let tlsDaemon;
let unixDaemon;
let ws;
let user;
before(async () => {
  ws = h.makeWorkspace({ 'hello.txt': 'hi\n' });
  unixDaemon = await h.startDaemon();
  if (opensslMissing) return;
  // The daemon's config and key are its state: outside /tmp.
  pki = h.privateDir('corral-node-pki-');
  execFileSync('openssl', [
    'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '2', '-subj', '/CN=corral test',
    '-addext', 'subjectAltName=DNS:localhost,IP:127.0.0.1', '-addext', 'basicConstraints=critical,CA:FALSE',
    '-addext', 'extendedKeyUsage=serverAuth', '-keyout', join(pki, 'key.pem'), '-out', join(pki, 'cert.pem'),
  ], { stdio: 'ignore' });
  cert = readFileSync(join(pki, 'cert.pem'));
  user = execFileSync('id', ['-un'], { encoding: 'utf8' }).trim();
  const sha256 = createHash('sha256').update(TOKEN).digest('hex');
  writeFileSync(
    join(pki, 'corral.toml'),
    `[tls]\ncert = "${pki}/cert.pem"\nkey = "${pki}/key.pem"\n[[tokens]]\nname = "test"\nsha256 = "${sha256}"\nuser = "${user}"\n`,
  );
  tlsDaemon = await h.startDaemon({
    tcpPort: await h.freePort(),
    tls: true,
    extraArgs: ['--config', join(pki, 'corral.toml')],
    clientOptions: { tls: { rootCerts: cert }, token: TOKEN },
  });
});
after(async () => {
  await tlsDaemon?.stop();
  await unixDaemon?.stop();
  if (pki) h.removePrivateDir(pki);
  h.removeWorkspace(ws);
});

/** Runs `fn` with $CORRAL_TOKEN set to `value` (unset for undefined). */
async function withEnvToken(value, fn) {
  const saved = process.env.CORRAL_TOKEN;
  if (value === undefined) delete process.env.CORRAL_TOKEN;
  else process.env.CORRAL_TOKEN = value;
  try {
    return await fn();
  } finally {
    if (saved === undefined) delete process.env.CORRAL_TOKEN;
    else process.env.CORRAL_TOKEN = saved;
  }
}

async function whoami(client) {
  const session = await client.openSession({ cwd: ws });
  try {
    const r = await session.shell(['id', '-un']);
    return r.stdout.head.toString().trim();
  } finally {
    await session.close();
  }
}

test('the token option over TLS', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  await withEnvToken(undefined, async () => {
    const client = new Client(tlsDaemon.address, { tls: { rootCerts: cert }, token: TOKEN, deadlineMs: 30_000 });
    try {
      assert.equal(await client.health(), 'SERVING');
      assert.equal(await whoami(client), user);
      // Streams carry it too.
      const session = await client.openSession({ cwd: ws });
      const events = [];
      for await (const ev of session.shellStream(['cat', 'hello.txt'])) events.push(ev.type);
      assert.deepEqual([events[0], events.at(-1)], ['begin', 'end']);
      await session.close();
    } finally {
      client.close();
    }
  });
});

test('$CORRAL_TOKEN when no token is given, by address or by name', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  await withEnvToken(TOKEN, async () => {
    const port = tlsDaemon.address.split(':').at(-1);
    for (const address of [tlsDaemon.address, `tcp:localhost:${port}`]) {
      const client = new Client(address, { tls: { rootCerts: cert }, deadlineMs: 30_000 });
      try {
        assert.equal(await whoami(client), user);
      } finally {
        client.close();
      }
    }
  });
});

test('no token or a wrong one is UNAUTHENTICATED', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  for (const [env, token] of [[undefined, undefined], [undefined, 'token-124'], ['token-124', undefined]]) {
    await withEnvToken(env, async () => {
      const client = new Client(tlsDaemon.address, { tls: { rootCerts: cert }, token, deadlineMs: 30_000 });
      try {
        await assert.rejects(client.openSession({ cwd: ws }), UnauthenticatedError);
      } finally {
        client.close();
      }
    });
  }
});

test('a token is never sent over plain TCP', async () => {
  await withEnvToken(undefined, async () => {
    assert.throws(() => new Client('tcp:127.0.0.1:9', { token: TOKEN }), (err) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.match(err.message, /only sent over TLS, and tcp:127\.0\.0\.1:9 is plain TCP/);
      return true;
    });
  });
  await withEnvToken(TOKEN, async () => {
    assert.throws(() => new Client('tcp:127.0.0.1:9'), /\(the token option or \$CORRAL_TOKEN\) is only sent over TLS/);
  });
});

test('a Unix socket ignores $CORRAL_TOKEN and refuses the token option', async () => {
  await withEnvToken(TOKEN, async () => {
    const client = new Client(unixDaemon.address);
    try {
      assert.equal(await client.health(), 'SERVING');
    } finally {
      client.close();
    }
  });
  assert.throws(() => new Client(unixDaemon.address, { token: TOKEN }), (err) => {
    assert.ok(err instanceof InvalidArgumentError);
    assert.match(err.message, /is a Unix socket, where the kernel says who you are/);
    return true;
  });
});

test('a token with characters a header cannot carry', async () => {
  await withEnvToken(undefined, async () => {
    assert.throws(() => new Client('tcp:127.0.0.1:9', { tls: true, token: 'a\nb' }), /characters a header cannot carry/);
  });
});

test('a missing socket says so', async () => {
  const dir = h.privateDir();
  const client = new Client(`unix:${dir}/corral.sock`, { deadlineMs: 5_000 });
  try {
    await assert.rejects(client.capabilities(), (err) => {
      assert.ok(err instanceof UnavailableError, String(err));
      assert.ok(err.message.startsWith(`cannot connect to ${dir}/corral.sock: no such socket (is \`corral serve\` running?`), err.message);
      return true;
    });
  } finally {
    client.close();
    h.removePrivateDir(dir);
  }
});

test('a socket nobody listens on says refused', async (t) => {
  const dir = h.privateDir();
  // A socket file with no listener behind it, what a daemon that is gone leaves (Node cannot bind
  // without listening, and removes its socket on close: Python binds one).
  const sock = join(dir, 'corral.sock');
  const made = spawnSync('python3', ['-c', 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])', sock]);
  const client = new Client(`unix:${sock}`, { deadlineMs: 5_000 });
  try {
    if (made.status !== 0) return t.skip('python3 is needed to leave a socket nobody listens on');
    for (const call of [() => client.capabilities(), () => client.waitForReady(1_000)]) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof UnavailableError, String(err));
        assert.ok(err.message.startsWith(`cannot connect to ${sock}: connection refused`), err.message);
        assert.ok(err.message.includes('is `corral serve` running?'), err.message);
        return true;
      });
    }
  } finally {
    client.close();
    h.removePrivateDir(dir);
  }
});
