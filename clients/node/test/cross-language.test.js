// The Node client and the Rust CLI (`corral invoke … --session ID --json`, `corral read-file`,
// `corral list-dir`) report the same outputs for the same calls.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';
import { Client } from '../src/index.js';
import * as h from './helpers.js';

const run = promisify(execFile);
const fixture = h.loadFixture();

/** Runs the CLI; a tool failure exits 1 but still prints its JSON. */
async function cli(args) {
  try {
    const { stdout } = await run(h.corralBin(), args, { maxBuffer: 16 << 20 });
    return JSON.parse(stdout);
  } catch (err) {
    if (err.code === 1 && err.stdout) return JSON.parse(err.stdout);
    throw new Error(`corral ${args.join(' ')} failed (${err.code}): ${err.stderr ?? err.message}`);
  }
}

/** The CLI prints proto JSON with snake_case keys; the Node client uses camelCase. */
function camelize(value) {
  if (Array.isArray(value)) return value.map(camelize);
  if (value && typeof value === 'object') {
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [k.replace(/_([a-z])/g, (_, c) => c.toUpperCase()), camelize(v)]),
    );
  }
  return value;
}

describe('Node client vs Rust CLI', () => {
  let daemon;
  let client;
  const sides = {};
  before(async () => {
    daemon = await h.startDaemon();
    client = new Client(`unix:${daemon.socket}`);
    // Identical workspaces and sessions, one per side (calls such as apply_patch change the tree).
    for (const side of ['node', 'cli']) {
      const ws = h.makeWorkspace(fixture.files);
      sides[side] = { ws, session: await client.openSession(h.sessionSettings(fixture, ws)) };
    }
  });
  after(async () => {
    for (const { ws, session } of Object.values(sides)) {
      await session.close();
      h.removeWorkspace(ws);
    }
    client?.close();
    await daemon?.stop();
  });

  // Back to the placeholder, so the two workspaces compare equal.
  const neutral = (text, ws) => h.normalize(text.split(ws).join(h.PLACEHOLDER));

  test('every transcript call through Invoke', async () => {
    for (const { input } of fixture.items) {
      const freeform = input.type === 'custom_tool_call';
      const node = sides.node;
      const viaNode = await node.session.invoke(
        input.name,
        h.substitute(freeform ? input.input : input.arguments, node.ws),
        { callId: input.call_id, freeform },
      );
      const c = sides.cli;
      const args = [
        'invoke', input.name, h.substitute(freeform ? input.input : input.arguments, c.ws),
        '--socket', daemon.socket, '--session', c.session.id, '--json', '--call-id', input.call_id,
      ];
      if (freeform) args.push('--freeform');
      const viaCli = await cli(args);
      assert.deepEqual(
        { callId: viaNode.callId, output: neutral(viaNode.output, node.ws), success: viaNode.success },
        { callId: viaCli.call_id, output: neutral(viaCli.output, c.ws), success: viaCli.success },
        `${input.name} ${input.call_id}`,
      );
    }
  });

  test('typed read-file and list-dir: the same structured results', async () => {
    const { ws, session } = sides.node;
    const base = ['--socket', daemon.socket, '--session', session.id, '--json'];
    const viaCli = await cli(['read-file', 'src/app.py', '--offset', '2', '--limit', '3', ...base]);
    const viaNode = await session.readFile('src/app.py', { offset: 2, limit: 3 });
    assert.deepEqual(viaNode, camelize(viaCli));
    const dirCli = await cli(['list-dir', ws, '--depth', '2', ...base]);
    const dirNode = await session.listDir(ws, { depth: 2 });
    assert.deepEqual(dirNode, camelize(dirCli));
  });
});
