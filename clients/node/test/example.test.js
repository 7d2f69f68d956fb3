// examples/node/agent-loop.mjs runs end to end with a scripted stand-in for the model.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { after, before, test } from 'node:test';
import { Client } from '../src/index.js';
import * as h from './helpers.js';

const { runAgent } = await import(pathToFileURL(join(h.REPO_ROOT, 'examples', 'node', 'agent-loop.mjs')).href);
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
