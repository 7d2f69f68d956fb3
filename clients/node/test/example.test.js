// examples/node/agent-loop.mjs runs end to end with a scripted stand-in for the model, after the
// steps its header and the README give: `npm install` in examples/node (which links the client).
import assert from 'node:assert/strict';
import { realpathSync } from 'node:fs';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, test } from 'node:test';
import { Client } from '../src/index.js';
import * as h from './helpers.js';

const EXAMPLE_DIR = join(h.REPO_ROOT, 'examples', 'node');
await h.npm(['install', '--no-audit', '--no-fund'], { cwd: EXAMPLE_DIR });
const { runAgent } = await import(pathToFileURL(join(EXAMPLE_DIR, 'agent-loop.mjs')).href);

test('npm install in examples/node links this package', () => {
  assert.equal(realpathSync(join(EXAMPLE_DIR, 'node_modules', '@corral', 'client')), realpathSync(h.PACKAGE_ROOT));
});
const fixture = h.loadFixture();

let daemon;
let client;
let ws;
before(async () => {
  daemon = await h.startDaemon();
  client = new Client(`unix:${daemon.socket}`);
  ws = h.makeWorkspace(fixture.files);
});
after(async () => {
  client?.close();
  await daemon?.stop();
  h.removeWorkspace(ws);
});

test('the example agent loop replays the transcript', async () => {
  const calls = fixture.items.filter((i) => !i.requires).map((i) => h.substitute(i, ws));
  const final = { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'Done.' }] };
  // The scripted model: first all the recorded tool calls (after a reasoning item), then an answer.
  const script = [
    [{ type: 'reasoning', summary: [] }, ...calls.map((c) => c.input)],
    [final],
  ];
  const seen = [];
  const callModel = async ({ input, tools }) => {
    seen.push({ input: structuredClone(input), tools });
    return script[seen.length - 1];
  };
  const transcript = await runAgent({
    client,
    settings: h.sessionSettings(fixture, ws),
    prompt: 'Look around the repository.',
    callModel,
  });

  assert.equal(seen.length, 2);
  assert.ok(seen[0].tools.some((t) => t.name === 'read_file'));
  assert.deepEqual(seen[0].input, [{ role: 'user', content: 'Look around the repository.' }]);
  // The second request carries the model's items, then one output per call, in order.
  const outputs = seen[1].input.slice(2 + calls.length);
  assert.deepEqual(outputs.map(h.normalizeItem), calls.map((c) => c.expected));
  assert.deepEqual(transcript.at(-1), final);
  assert.equal(transcript.length, 1 + 1 + calls.length * 2 + 1);
});

test('the example runs against OPENAI_BASE_URL', async () => {
  // `node agent-loop.mjs "prompt"` as a user runs it, its model endpoint a local stand-in reached
  // through OPENAI_BASE_URL (with OPENAI_API_KEY and OPENAI_MODEL).
  const { createServer } = await import('node:http');
  const { execFile } = await import('node:child_process');
  const { promisify } = await import('node:util');
  const ws2 = h.makeWorkspace({ 'hello.txt': 'hi\n' });
  // The example opens a workspace-write session with /tmp writable (the daemons' state is never
  // there).
  const own = await h.startDaemon();
  const replies = [
    [{ type: 'function_call', name: 'list_dir', arguments: '{"dir_path":"."}', call_id: 'c1' }],
    [{ type: 'message', role: 'assistant', content: [{ type: 'output_text', text: 'done' }] }],
  ];
  const seen = [];
  const server = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ path: req.url, auth: req.headers.authorization, body: JSON.parse(body) });
      res.setHeader('content-type', 'application/json');
      res.end(JSON.stringify({ output: replies[seen.length - 1] }));
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  try {
    const { stdout } = await promisify(execFile)(process.execPath, [join(h.REPO_ROOT, 'examples', 'node', 'agent-loop.mjs'), 'look around'], {
      cwd: ws2,
      env: {
        ...process.env,
        CORRAL_SOCKET: `unix:${own.socket}`,
        OPENAI_BASE_URL: `http://127.0.0.1:${server.address().port}/v1/`,
        OPENAI_API_KEY: 'test-key',
        OPENAI_MODEL: 'test-model',
      },
    });
    assert.deepEqual(JSON.parse(stdout), replies[1][0]);
  } finally {
    server.close();
    await own.stop();
    h.removeWorkspace(ws2);
  }
  assert.deepEqual(seen.map((s) => [s.path, s.auth]), [['/v1/responses', 'Bearer test-key'], ['/v1/responses', 'Bearer test-key']]);
  assert.equal(seen[0].body.model, 'test-model');
  assert.deepEqual(seen[0].body.input, [{ role: 'user', content: 'look around' }]);
  assert.ok(seen[0].body.tools.some((t) => t.name === 'list_dir'));
  const result = seen[1].body.input.find((i) => i.type === 'function_call_output');
  assert.equal(result.call_id, 'c1');
  assert.equal(result.output, `Absolute path: ${ws2}/.\nhello.txt`);
});
