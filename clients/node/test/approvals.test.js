// Approval policies from the Node client: the adapters' onApproval (default: deny), decideApproval
// and classifyCommand, against a real daemon that allows escalation (so a retry without the
// sandbox can be approved).
import assert from 'node:assert/strict';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { after, before, test } from 'node:test';
import { ChatCompletionsAdapter, Client, FailedPreconditionError, NotFoundError, ResponsesAdapter } from '../src/index.js';
import * as h from './helpers.js';

const REJECTED = 'exec command rejected by user';

let daemon;
let client;
let ws;
let outside;
before(async () => {
  daemon = await h.startDaemon({ extraArgs: ['--allow-escalation', '--root-callers', 'trusted'] });
  client = new Client(daemon.address, { deadlineMs: 60_000 });
  ws = h.makeWorkspace();
  // Outside every writable root (not under /tmp, nor in the checkout, which may be there).
  outside = h.privateDir('corral-node-outside-');
});
after(async () => {
  client?.close();
  await daemon?.stop();
  if (ws) h.removeWorkspace(ws);
  if (outside) h.removePrivateDir(outside);
});

const env = () => ({ PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: ws });
const open = (approvalPolicy) => client.openSession({ cwd: ws, mode: 'workspace-write', env: env(), approvalPolicy });
const call = (name, args, id = 'c1') => ({ type: 'function_call', name, arguments: JSON.stringify(args), call_id: id });

test('ResponsesAdapter: an approved retry reruns unsandboxed and its output reaches the model', async () => {
  const target = join(outside, 'report.txt');
  const asked = [];
  const session = await open('on-failure');
  try {
    const script = `echo escaped > ${target} && cat ${target}`;
    const adapter = new ResponsesAdapter(session, {
      onApproval: async (request) => {
        asked.push(request);
        return 'approved';
      },
    });
    const out = await adapter.handle(call('shell', { command: ['bash', '-c', script] }));
    assert.equal(asked.length, 1);
    assert.equal(asked[0].kind, 'APPROVAL_KIND_RETRY_UNSANDBOXED');
    assert.equal(asked[0].reason, 'command failed; retry without sandbox?');
    assert.deepEqual(asked[0].command, ['bash', '-c', script]);
    assert.equal(asked[0].rejectedOutput, REJECTED);
    assert.equal(out.call_id, 'c1');
    assert.equal(JSON.parse(out.output).output, 'escaped\n');
    assert.equal(readFileSync(target, 'utf8'), 'escaped\n');
  } finally {
    await session.close();
  }
});

test('without onApproval the adapters deny and nothing runs; known-safe commands run at once', async () => {
  writeFileSync(join(ws, 'x'), 'keep');
  const session = await open('untrusted');
  try {
    const responses = new ResponsesAdapter(session);
    const ls = await responses.handle(call('shell', { command: ['ls'] }));
    assert.match(ls.output, /"output":"x\\n"/);
    assert.deepEqual(await responses.handle(call('shell', { command: ['rm', 'x'] })), {
      type: 'function_call_output',
      call_id: 'c1',
      output: REJECTED,
    });
    const tc = { id: 't1', type: 'function', function: { name: 'shell', arguments: '{"command":["rm","x"]}' } };
    assert.deepEqual(await new ChatCompletionsAdapter(session).handle(tc), { role: 'tool', tool_call_id: 't1', content: REJECTED });
    assert.equal(readFileSync(join(ws, 'x'), 'utf8'), 'keep');
  } finally {
    await session.close();
  }
});

test('ChatCompletionsAdapter: approved_for_session is asked once', async () => {
  const asked = [];
  const session = await open('untrusted');
  try {
    const adapter = new ChatCompletionsAdapter(session, {
      onApproval: (request) => {
        asked.push(request.command.join(' '));
        return 'approved_for_session';
      },
    });
    const tc = { id: 't1', type: 'function', function: { name: 'shell', arguments: '{"command":["touch","a"]}' } };
    for (let i = 0; i < 2; i++) {
      const msg = await adapter.handle(tc);
      assert.equal(JSON.parse(msg.content).metadata.exit_code, 0);
    }
    assert.deepEqual(asked, ['touch a']);
    assert.ok(existsSync(join(ws, 'a')));
  } finally {
    await session.close();
  }
});

test('decideApproval, its errors, the typed Shell and ShellStream, classifyCommand', async () => {
  assert.equal(await client.classifyCommand(['ls', '-la']), true);
  assert.equal(await client.classifyCommand(['rm', 'x']), false);
  const session = await open('untrusted');
  try {
    const r = await session.invoke('shell', { command: ['touch', 't'] }, { callId: 'c9' });
    assert.equal(r.output, '');
    assert.equal(r.approval.callId, 'c9');
    assert.equal(r.approval.kind, 'APPROVAL_KIND_BEFORE_RUN');
    await assert.rejects(session.decideApproval('0'.repeat(32), 'approved'), NotFoundError);
    assert.equal(existsSync(join(ws, 't')), false);
    const done = await session.decideApproval(r.approval.approvalId, true);
    assert.equal(done.result, 'invoke');
    assert.equal(done.invoke.success, true);
    assert.equal('approval' in done.invoke, false);
    assert.ok(existsSync(join(ws, 't')));
    await assert.rejects(session.decideApproval(r.approval.approvalId, 'denied'), FailedPreconditionError);

    const typed = await session.shell(['touch', 's']);
    assert.ok(typed.approval, 'the typed Shell waits too');
    const shell = await session.decideApproval(typed.approval.approvalId, 'approved');
    assert.equal(shell.result, 'shell');
    assert.equal(shell.shell.success, true);
    const events = [];
    for await (const ev of session.shellStream(['touch', 'streamed'])) events.push(ev);
    assert.deepEqual(events.map((e) => e.type), ['approval']);
    const streamed = await session.decideApproval(events[0].request.approvalId, 'denied').catch((e) => e);
    assert.equal(streamed.code, 'PERMISSION_DENIED');
    assert.equal(existsSync(join(ws, 'streamed')), false);
  } finally {
    await session.close();
  }
});
