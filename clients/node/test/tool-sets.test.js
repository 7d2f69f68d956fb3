// A session's tool set through the client and both adapters: the openSession options,
// exec_command/write_stdin (sharing the process table with session.processes), update_plan,
// view_image's content items, and messages beyond gRPC's default 4 MiB.
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { ChatCompletionsAdapter, Client, MAX_MESSAGE_BYTES, ResourceExhaustedError, ResponsesAdapter } from '../src/index.js';
import * as h from './helpers.js';

const ENV = { PATH: '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' };
// A 1×1 PNG.
const PNG = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==', 'base64');
const DATA_URL = `data:image/png;base64,${PNG.toString('base64')}`;

const names = (tools) => tools.map((t) => t.name ?? t.function.name);
const call = (name, args, callId = 'c') => ({ type: 'function_call', name, arguments: JSON.stringify(args), call_id: callId });
const chatCall = (name, args, id = 'c') => ({ id, type: 'function', function: { name, arguments: JSON.stringify(args) } });

describe('tool sets', () => {
  let daemon;
  let client;
  let ws;
  before(async () => {
    daemon = await h.startDaemon();
    client = new Client(`unix:${daemon.socket}`, { deadlineMs: 60_000 });
    ws = h.makeWorkspace({ 'dot.png': PNG });
  });
  after(async () => {
    client?.close();
    await daemon?.stop();
    if (ws) h.removeWorkspace(ws);
  });

  const open = (settings = {}) => client.openSession({ cwd: ws, mode: 'read-only', env: { ...ENV, HOME: ws }, ...settings });

  test('openSession takes every tool-set option', async () => {
    const d = await open();
    const listed = names(await d.listTools());
    assert.deepEqual(listed.slice(0, 2), ['exec_command', 'write_stdin']);
    for (const n of ['update_plan', 'view_image', 'apply_patch']) assert.ok(listed.includes(n), n);
    await d.close();

    const s = await open({ shellTool: 'shell_command', applyPatchTool: 'function', updatePlan: false, viewImage: false });
    const tools = await s.listTools();
    assert.deepEqual(names(tools), ['shell_command', 'read_file', 'list_dir', 'grep_files', 'apply_patch']);
    assert.equal(tools.at(-1).type, 'function');
    assert.equal((await s.invoke('view_image', { path: 'dot.png' })).output, 'unsupported call: view_image');
    await s.close();

    const none = await open({ shellTool: 'none', applyPatchTool: 'none' });
    assert.deepEqual(names(await none.listTools()), ['read_file', 'list_dir', 'grep_files', 'update_plan', 'view_image']);
    await none.close();

    const blind = await open({ noImageInput: true });
    assert.deepEqual(await blind.invoke('view_image', { path: 'dot.png' }, { callId: 'b' }), {
      callId: 'b',
      output: 'view_image is not allowed because you do not support image inputs',
      success: false,
    });
    await blind.close();
    await assert.rejects(open({ shellTool: 'zsh' }), TypeError);
    await assert.rejects(open({ updatePlan: 'no' }), TypeError);
  });

  test('view_image through both adapters', async () => {
    const s = await open();
    const responses = new ResponsesAdapter(s);
    assert.deepEqual(await responses.handle(call('view_image', { path: 'dot.png' }, 'v1')), {
      type: 'function_call_output',
      call_id: 'v1',
      output: [{ type: 'input_image', image_url: DATA_URL }],
    });
    const original = await responses.handle(call('view_image', { path: 'dot.png', detail: 'original' }, 'v2'));
    assert.deepEqual(original.output, [{ type: 'input_image', image_url: DATA_URL, detail: 'original' }]);
    // Chat Completions: the image as a content part of the tool message, as Codex sends it.
    const chat = new ChatCompletionsAdapter(s);
    assert.deepEqual(await chat.handle(chatCall('view_image', { path: 'dot.png' }, 'v3')), {
      role: 'tool',
      tool_call_id: 'v3',
      content: [{ type: 'image_url', image_url: { url: DATA_URL } }],
    });
    // A failure is text in both.
    assert.match((await responses.handle(call('view_image', { path: 'missing.png' }))).output, /^unable to locate image at/);
    assert.match((await chat.handle(chatCall('view_image', { path: 'missing.png' }))).content, /^unable to locate image at/);
    await s.close();
  });

  test('update_plan through both adapters', async () => {
    const s = await open();
    const plan = { explanation: 'go', plan: [{ step: 'read', status: 'completed' }, { step: 'fix', status: 'in_progress' }] };
    assert.equal((await new ResponsesAdapter(s).handle(call('update_plan', plan))).output, 'Plan updated');
    assert.equal((await new ChatCompletionsAdapter(s).handle(chatCall('update_plan', plan))).content, 'Plan updated');
    await s.close();
  });

  test('a custom tool call through the Chat Completions adapter', async () => {
    const s = await open();
    const msg = await new ChatCompletionsAdapter(s).handle({
      id: 'p1',
      type: 'custom',
      custom: { name: 'apply_patch', input: '*** Begin Patch\n*** End Patch\n' },
    });
    assert.equal(msg.role, 'tool');
    assert.equal(msg.tool_call_id, 'p1');
    assert.equal(typeof msg.content, 'string');
    await assert.rejects(new ChatCompletionsAdapter(s).handle({ id: 'x', type: 'mystery' }), TypeError);
    await s.close();
  });

  test('exec_command and write_stdin share the process table', async () => {
    const s = await client.openSession({ cwd: ws, mode: 'workspace-write', excludeSlashTmp: true, env: { ...ENV, HOME: ws } });
    const adapter = new ResponsesAdapter(s);
    const out = (await adapter.handle(call('exec_command', { cmd: 'cat', tty: true, yield_time_ms: 300 }, 'e1'))).output;
    const pid = Number(out.match(/Process running with session ID (\d+)/)[1]);
    // The model's process is one of the session's processes...
    const [info] = await s.processes.list();
    assert.equal(info.id, pid);
    assert.equal(info.tty, true);
    const proc = s.processes.attach(pid);
    await proc.write('from-the-api\n');
    // ...and write_stdin (here through the Chat Completions adapter) sees what the API wrote.
    const msg = await new ChatCompletionsAdapter(s).handle(chatCall('write_stdin', { session_id: pid, chars: 'ping\n', yield_time_ms: 300 }));
    assert.match(msg.content, /from-the-api/);
    assert.match(msg.content, /ping/);
    // A process started here is reachable by write_stdin.
    const started = await s.processes.start({ argv: ['cat'], tty: true });
    const pong = (await adapter.handle(call('write_stdin', { session_id: started.id, chars: 'pong\n', yield_time_ms: 300 }))).output;
    assert.match(pong, /pong/);
    assert.deepEqual((await s.processes.list()).map((p) => p.id).sort((a, b) => a - b), [pid, started.id].sort((a, b) => a - b));
    await proc.terminate();
    await started.terminate();
    await s.close();
  });

  test('messages beyond 4 MiB', async () => {
    // A readFile answer of ~17 MB: over gRPC's default 4 MiB receive limit, within the client's 64 MiB.
    writeFileSync(join(ws, 'big.txt'), `${'x'.repeat(400)}\n`.repeat(20_000));
    assert.equal(MAX_MESSAGE_BYTES, 64 * 1024 * 1024);
    const s = await open();
    const r = await s.readFile('big.txt', { limit: 20_000 });
    assert.equal(r.lines.length, 20_000);
    assert.ok(r.text.length > 8_000_000, 'lines and text: over 16 MB in all');
    // With gRPC's default limit the same answer is refused.
    const small = new Client(`unix:${daemon.socket}`, { channelOptions: { 'grpc.max_receive_message_length': 4 * 1024 * 1024 } });
    try {
      await assert.rejects(small.session(s.id).readFile('big.txt', { limit: 20_000 }), ResourceExhaustedError);
    } finally {
      small.close();
    }
    await s.close();
  });
});
