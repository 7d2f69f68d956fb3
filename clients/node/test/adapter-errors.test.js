// An agent loop never crashes on a tool result: errors the model's call caused (a result too large
// for one response or for this client's receive limit, bad arguments) reach the model as text with
// success false, through both adapters; errors of the connection still reject. Against a real daemon.
import assert from 'node:assert/strict';
import { closeSync, openSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { ChatCompletionsAdapter, Client, ResponsesAdapter, UnavailableError } from '../src/index.js';
import * as h from './helpers.js';

const ASK_FOR_LESS = 'ask for less (read_file: offset and limit';

/** `size` bytes of 100-byte lines (under read_file's line-length cut). */
function bigFile(path, size) {
  const fd = openSync(path, 'w');
  const block = Buffer.from(`${'x'.repeat(99)}\n`.repeat(10_000));
  for (let n = 0; n < size; n += block.length) writeSync(fd, block);
  closeSync(fd);
}

const readAll = JSON.stringify({ file_path: 'big.txt', offset: 1, limit: 100_000_000 });
const functionCall = (name, args, id = 'c1') => ({ type: 'function_call', name, arguments: args, call_id: id });
const chatCall = (name, args, id = 't1') => ({ id, type: 'function', function: { name, arguments: args } });

let daemon;
let ws;
before(async () => {
  daemon = await h.startDaemon();
  ws = h.makeWorkspace();
});
after(async () => {
  await daemon?.stop();
  h.removeWorkspace(ws);
});

/** Both adapters on a session of `client`, with every result's success flag recorded. */
async function adapters(client) {
  const session = await client.openSession({ cwd: ws });
  const seen = [];
  const onResult = (_call, result) => seen.push(result.success);
  return { session, seen, responses: new ResponsesAdapter(session, { onResult }), chat: new ChatCompletionsAdapter(session, { onResult }) };
}

test('a result over 32 MiB is model text through both adapters, and the loop goes on', async () => {
  // The model asks read_file for everything of a 40 MiB file: more than one response may carry.
  bigFile(join(ws, 'big.txt'), 40 << 20);
  const client = new Client(daemon.address);
  try {
    const { session, seen, responses, chat } = await adapters(client);
    const out = await responses.handle(functionCall('read_file', readAll));
    assert.equal(out.type, 'function_call_output');
    assert.equal(out.call_id, 'c1');
    assert.ok(out.output.includes(ASK_FOR_LESS), out.output.slice(0, 500));
    assert.ok(out.output.length < 4096);
    const msg = await chat.handle(chatCall('read_file', readAll));
    assert.equal(msg.tool_call_id, 't1');
    assert.ok(msg.content.includes(ASK_FOR_LESS), msg.content.slice(0, 500));
    const less = await responses.handle(functionCall('read_file', JSON.stringify({ file_path: 'big.txt', offset: 1, limit: 2 }), 'c2'));
    assert.equal(less.output, `L1: ${'x'.repeat(99)}\nL2: ${'x'.repeat(99)}`);
    assert.deepEqual(seen, [false, false, true]);
    await session.close();
  } finally {
    client.close();
  }
});

test("a result over the client's receive limit is model text", async () => {
  // Under the daemon's 32 MiB, over this client's 1 MiB: grpc-js's own RESOURCE_EXHAUSTED.
  bigFile(join(ws, 'big.txt'), 2 << 20);
  const client = new Client(daemon.address, { channelOptions: { 'grpc.max_receive_message_length': 1 << 20 } });
  try {
    const { session, seen, responses, chat } = await adapters(client);
    const out = await responses.handle(functionCall('read_file', readAll));
    assert.ok(out.output.startsWith('the result is too large to receive ('), out.output);
    assert.ok(out.output.includes(ASK_FOR_LESS), out.output);
    const msg = await chat.handle(chatCall('read_file', readAll));
    assert.equal(msg.content, out.output);
    assert.deepEqual(seen, [false, false]);
    await session.close();
  } finally {
    client.close();
  }
});

test("invalid arguments of the model's are model text", async () => {
  // A tool call with an empty name: the daemon answers INVALID_ARGUMENT.
  const client = new Client(daemon.address);
  try {
    const { session, seen, responses, chat } = await adapters(client);
    const out = await responses.handle(functionCall('', '{}'));
    assert.deepEqual(out, { type: 'function_call_output', call_id: 'c1', output: 'name is required: the tool the model called' });
    const msg = await chat.handle(chatCall('', '{}'));
    assert.deepEqual(msg, { role: 'tool', tool_call_id: 't1', content: 'name is required: the tool the model called' });
    assert.deepEqual(seen, [false, false]);
    await session.close();
  } finally {
    client.close();
  }
});

test('connection errors still reject', async () => {
  const own = await h.startDaemon();
  const client = new Client(own.address, { deadlineMs: 10_000 });
  try {
    const { responses, chat } = await adapters(client);
    await own.stop();
    await assert.rejects(responses.handle(functionCall('list_dir', '{"dir_path":"."}')), UnavailableError);
    await assert.rejects(chat.handle(chatCall('list_dir', '{"dir_path":"."}')), UnavailableError);
  } finally {
    client.close();
    await own.stop();
  }
});
