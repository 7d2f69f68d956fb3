// Network modes from the Node client: openSession({ network: 'proxy', allowDomains, denyDomains }),
// setNetworkRules (on the session and on the client), and the daemon's refusals naming the field.
// Against a real daemon whose [egress] table points test names at a small HTTP server on 127.0.0.2
// and lets the proxy reach loopback (as tests/it/egress.rs does); commands run curl and Node's
// http module inside the sandbox, through the proxy the session's environment names.
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { Client, FailedPreconditionError, InvalidArgumentError } from '../src/index.js';
import * as h from './helpers.js';

const CONFIG = `
[egress]
allowed_networks = ["127.0.0.0/8"]

[egress.hosts]
"allowed.test" = ["127.0.0.2"]
"other.allowed.test" = ["127.0.0.2"]
"denied.test" = ["127.0.0.2"]
`;

let upstream;
let port;
let state;
let daemon;
let client;
let ws;
before(async () => {
  // Answers every request with `hello from upstream PATH`.
  upstream = createServer((req, res) => {
    res.setHeader('Connection', 'close');
    res.end(`hello from upstream ${req.url}\n`);
  });
  await new Promise((res) => upstream.listen(0, '127.0.0.2', res));
  port = upstream.address().port;
  state = h.privateDir('corral-node-egress-');
  const config = join(state, 'corral.toml');
  writeFileSync(config, CONFIG);
  daemon = await h.startDaemon({ extraArgs: ['--config', config] });
  client = new Client(daemon.address, { deadlineMs: 60_000 });
  ws = h.makeWorkspace();
});
after(async () => {
  client?.close();
  await daemon?.stop();
  if (state) h.removePrivateDir(state);
  if (ws) h.removeWorkspace(ws);
  await new Promise((res) => (upstream ? upstream.close(res) : res()));
});

const env = () => ({ PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: ws });
/** A script printing the body, then the HTTP status on its own last line. */
const curl = (host, path = '/') => `curl -sS --max-time 20 -w '\\n%{http_code}' http://${host}:${port}${path}`;
/** What a script printed (both streams), and the status on its last line. */
async function fetchIn(session, host, path) {
  const r = await session.shell(curl(host, path));
  const out = r.combined.head.toString('utf8');
  return { out, status: out.trimEnd().split('\n').at(-1) };
}

test('a proxied session reaches only the allowed hosts, and setNetworkRules changes them', async () => {
  const session = await client.openSession({
    cwd: ws,
    env: env(),
    network: 'proxy',
    allowDomains: ['allowed.test', '*.allowed.test'],
    denyDomains: ['other.allowed.test'],
  });
  try {
    const proxy = await session.shell('echo $HTTP_PROXY');
    assert.match(proxy.stdout.head.toString(), /^http:\/\/127\.0\.0\.1:\d+\n$/, proxy.text);

    let r = await fetchIn(session, 'allowed.test', '/curl');
    assert.ok(r.out.startsWith('hello from upstream /curl') && r.status === '200', r.out);
    // Node's http module inside the sandbox, pointed at the proxy the environment names.
    const script = `const u=new URL(process.env.HTTP_PROXY);require('http').get({host:u.hostname,port:u.port,path:'http://allowed.test:${port}/node'},r=>{r.setEncoding('utf8');r.on('data',c=>process.stdout.write(c))}).on('error',e=>{console.error(e.message);process.exit(1)})`;
    const ran = await session.shell([process.execPath, '-e', script]);
    assert.equal(ran.exitCode, 0, ran.text);
    assert.equal(ran.stdout.head.toString(), 'hello from upstream /node\n');

    // No allow rule; a deny rule over an allow rule: the proxy's 403, naming the host.
    r = await fetchIn(session, 'denied.test');
    assert.ok(r.status === '403' && r.out.includes('denied.test') && !r.out.includes('hello from upstream'), r.out);
    r = await fetchIn(session, 'other.allowed.test');
    assert.ok(r.status === '403' && r.out.includes('deny'), r.out);
    // Around the proxy: nothing.
    const direct = await session.shell(`curl -sS --noproxy '*' --max-time 5 http://127.0.0.2:${port}/`);
    assert.ok(direct.exitCode !== 0 && !direct.text.includes('hello from upstream'), direct.text);

    // New rules for the next connections.
    assert.equal(await session.setNetworkRules({ allowDomains: ['denied.test'] }), undefined);
    r = await fetchIn(session, 'denied.test', '/now');
    assert.ok(r.out.startsWith('hello from upstream /now') && r.status === '200', r.out);
    r = await fetchIn(session, 'allowed.test');
    assert.equal(r.status, '403', r.out);

    // By the client with the id: an allow rule for another port only, then no rules at all.
    await client.setNetworkRules({ sessionId: session.id, allowDomains: [`allowed.test:${port + 1}`] });
    r = await fetchIn(session, 'allowed.test');
    assert.equal(r.status, '403', r.out);
    await client.setNetworkRules({ sessionId: session.id, allowDomains: [`allowed.test:${port}`] });
    r = await fetchIn(session, 'allowed.test', '/port');
    assert.ok(r.out.startsWith('hello from upstream /port'), r.out);
    await session.setNetworkRules();
    r = await fetchIn(session, 'allowed.test');
    assert.equal(r.status, '403', r.out);
  } finally {
    await session.close();
  }
});

test('bad rules and contradictions reject with InvalidArgumentError naming the field', async () => {
  const open = (settings) => client.openSession({ cwd: ws, env: env(), ...settings });
  const refused = [
    [{ network: 'proxy', allowDomains: ['ok.test', '*'] }, 'allow_domains[1]'],
    [{ network: 'proxy', allowDomains: ['https://x.test'] }, 'allow_domains[0]'],
    [{ network: 'proxy', denyDomains: ['*.com'] }, 'deny_domains[0]'],
    // networkAccess: true says "on": with 'proxy' (or 'off') the daemon refuses it.
    [{ network: 'proxy', networkAccess: true }, 'network_mode'],
    [{ network: 'off', networkAccess: true }, 'network_mode'],
    [{ network: 'proxy', mode: 'danger-full-access' }, 'network_mode'],
    [{ network: 'on', allowDomains: ['x.test'] }, 'allow_domains'],
    [{ allowDomains: ['x.test'] }, 'allow_domains'],
  ];
  for (const [settings, field] of refused) {
    await assert.rejects(open(settings), (err) => {
      assert.ok(err instanceof InvalidArgumentError, `${JSON.stringify(settings)}: ${err}`);
      assert.deepEqual(err.fieldViolations.map((v) => v.field), [field], JSON.stringify(settings));
      return true;
    });
  }
  // Refused here: an unknown mode name, a lone string where an array of rules goes.
  await assert.rejects(open({ network: 'proxied' }), { name: 'TypeError', message: /network mode: proxied/ });
  await assert.rejects(open({ network: 'proxy', allowDomains: 'x.test' }), { name: 'TypeError', message: /allowDomains must be an array/ });

  // A malformed rule changes nothing; a session of another mode has no rules to set.
  const proxied = await open({ network: 'proxy', allowDomains: ['allowed.test'] });
  try {
    await assert.rejects(proxied.setNetworkRules({ allowDomains: ['ok.test', '*.com'] }), (err) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.deepEqual(err.fieldViolations.map((v) => v.field), ['allow_domains[1]']);
      return true;
    });
    const r = await fetchIn(proxied, 'allowed.test', '/kept');
    assert.ok(r.out.startsWith('hello from upstream /kept'), r.out);
    await assert.rejects(proxied.setNetworkRules({ denyDomains: 'x.test' }), TypeError);
  } finally {
    await proxied.close();
  }
  for (const settings of [{ network: 'off' }, { network: 'on' }, {}]) {
    const s = await open(settings);
    try {
      await assert.rejects(s.setNetworkRules({ allowDomains: ['x.test'] }), FailedPreconditionError);
    } finally {
      await s.close();
    }
  }
});
