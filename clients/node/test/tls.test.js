// TCP+TLS: corral itself listens on Unix sockets and loopback TCP; a TLS front (e.g. a proxy) is
// stood in for by a grpc-js server serving the same corral.v1 protos with a throwaway certificate.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { Client, corralPackage, PermissionDeniedError } from '../src/index.js';

let dir;
let server;
let port;
let cert;
let opensslMissing = false;

before(async () => {
  dir = mkdtempSync(join(tmpdir(), 'corral-node-tls-'));
  try {
    execFileSync('openssl', [
      'req', '-x509', '-newkey', 'rsa:2048', '-nodes', '-days', '1', '-subj', '/CN=localhost',
      '-addext', 'subjectAltName=DNS:localhost', '-keyout', join(dir, 'key.pem'), '-out', join(dir, 'cert.pem'),
    ], { stdio: 'ignore' });
  } catch {
    opensslMissing = true;
    return;
  }
  cert = readFileSync(join(dir, 'cert.pem'));
  const pkg = corralPackage();
  server = new grpc.Server();
  server.addService(pkg.Sessions.service, {
    getCapabilities: (_call, cb) => cb(null, { apiVersion: 'corral.v1', serverVersion: 'tls-stand-in' }),
    openSession: (_call, cb) => cb({ code: grpc.status.PERMISSION_DENIED, details: 'no sessions here' }),
    closeSession: (_call, cb) => cb(null, {}),
  });
  const creds = grpc.ServerCredentials.createSsl(null, [{ private_key: readFileSync(join(dir, 'key.pem')), cert_chain: cert }]);
  port = await new Promise((res, rej) => server.bindAsync('127.0.0.1:0', creds, (err, p) => (err ? rej(err) : res(p))));
});

after(() => {
  server?.forceShutdown();
  rmSync(dir, { recursive: true, force: true });
});

test('tls: rootCerts and serverName', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  const client = new Client(`tcp:127.0.0.1:${port}`, { tls: { rootCerts: cert, serverName: 'localhost' } });
  try {
    const caps = await client.capabilities();
    assert.equal(caps.serverVersion, 'tls-stand-in');
    await assert.rejects(client.openSession({ cwd: dir }), PermissionDeniedError);
  } finally {
    client.close();
  }
});

test('tls: a client without the CA is refused', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  const client = new Client(`tcp:127.0.0.1:${port}`, { tls: { serverName: 'localhost' }, deadlineMs: 3000 });
  try {
    await assert.rejects(client.capabilities(), (err) => err.code === 'UNAVAILABLE' || err.code === 'DEADLINE_EXCEEDED');
  } finally {
    client.close();
  }
});

test('plaintext to a TLS port fails', async (t) => {
  if (opensslMissing) return t.skip('openssl not available to make a test certificate');
  const client = new Client(`tcp:127.0.0.1:${port}`, { deadlineMs: 3000 });
  try {
    await assert.rejects(client.capabilities());
  } finally {
    client.close();
  }
});
