// Typed use of @corral/client's public API, type-checked (never run) by test/types.test.js with
// `tsc --noEmit` in strict mode. The `@ts-expect-error` lines check that the declarations refuse
// what the runtime refuses: if one of them type-checks, tsc fails.
import {
  ChatCompletionsAdapter,
  Client,
  CorralError,
  type Cursor,
  DEFAULT_MODE,
  Follower,
  InvalidArgumentError,
  NotFoundError,
  type OutputChunk,
  type ProcessState,
  ResponsesAdapter,
  type Session,
  type ShellEvent,
  type TransferSummary,
  TransferChangedError,
  defaultTarget,
} from '@corral/client';

export async function use(address: string = defaultTarget()): Promise<void> {
  const client = new Client(address, { deadlineMs: 30_000 });
  new Client('tcp:corral.example:7443', { tls: { rootCerts: Buffer.from('') }, token: 'secret' }).close();
  // @ts-expect-error: a token is a string
  new Client('tcp:corral.example:7443', { tls: true, token: 42 });
  await client.waitForReady(1_000);
  const health: string = await client.health();
  const caps = await client.capabilities();
  const tools: string[] = caps.tools;
  const mode: 'read-only' = DEFAULT_MODE;
  const session: Session = await client.openSession({ cwd: '/srv/repo', env: { PATH: '/usr/bin' }, shellTool: 'shell_command' });
  // @ts-expect-error: not a sandbox mode
  await client.openSession({ mode: 'sandboxed' });
  const attached: Session = client.session(session.id);
  const proxied: Session = await client.openSession({ network: 'proxy', allowDomains: ['pypi.org', '*.pythonhosted.org:443'], denyDomains: [] });
  await proxied.setNetworkRules({ allowDomains: ['github.com'], deadlineMs: 5_000 });
  await client.setNetworkRules({ sessionId: proxied.id, denyDomains: ['gist.github.com'] });
  // @ts-expect-error: not a network mode
  await client.openSession({ network: 'firewalled' });
  // @ts-expect-error: rules are an array
  await proxied.setNetworkRules({ allowDomains: 'github.com' });

  const file = await attached.readFile('README.md', { limit: 3, mode: 'indentation', indentation: { maxLevels: 1 } });
  const firstLine: number | undefined = file.lines[0]?.number;
  const listing = await session.listDir('.', { depth: 2 });
  const kinds: string[] = listing.entries.map((e) => e.kind);
  const grep = await session.grepFiles('TODO', { include: '*.rs' });
  const patch = await session.applyPatch('*** Begin Patch\n*** End Patch\n');
  const shell = await session.shell(['make', 'test'], { timeoutMs: 60_000, truncation: { bytes: 1000 } });
  const exit: number = shell.exitCode;
  // @ts-expect-error: the command is an argv array or a script string
  await session.shell(42);
  for await (const ev of session.shellStream('echo hi')) {
    const e: ShellEvent = ev;
    if (e.type === 'delta') e.data.toString('utf8');
    else if (e.type === 'end') e.result.exitCode.toFixed();
  }

  const proc = await session.processes.start({ argv: ['sleep', '1'], tty: false });
  // @ts-expect-error: exactly one of argv and script
  await session.processes.start({ workdir: '.' });
  await proc.write('input\n', { closeStdin: true });
  const follower: Follower = proc.follow({ waitMs: 500 });
  for await (const chunk of follower) {
    const c: OutputChunk = chunk;
    c.data.length.toFixed();
    break;
  }
  const cursor: Cursor = follower.cursor;
  const again = client.session(session.id).processes.attach(proc.id).follow({ afterSeq: cursor });
  const state: ProcessState | null = again.state;
  const final: ProcessState = await proc.wait({ timeoutMs: 1_000 });
  await proc.signal('TERM');
  await proc.terminate();
  const listed = await session.processes.list();

  const bytes: Buffer = await session.files.read('a.bin');
  // @ts-expect-error: read resolves to bytes
  const notBytes: number = await session.files.read('a.bin');
  const written: { path: string; size: number } = await session.files.write('b.bin', bytes, { mode: 0o640, createParents: true });
  const up: TransferSummary = await session.files.upload('./local', 'remote', { overwrite: true });
  const down: TransferSummary = await session.files.download('remote', './back', { deadlineMs: 60_000 });
  const skipped: string[] = down.skipped;

  const responses = new ResponsesAdapter(session, { exclude: ['view_image'] });
  const out = await responses.handle({ type: 'function_call', name: 'list_dir', arguments: '{}', call_id: 'c1' });
  const callId: string = out.call_id;
  const chat = new ChatCompletionsAdapter(session);
  const messages = await chat.handleMessage({ tool_calls: [{ id: 'c2', type: 'function', function: { name: 'read_file', arguments: '{}' } }] });
  const content = messages[0]?.content;

  try {
    await session.close();
  } catch (err) {
    if (err instanceof InvalidArgumentError) err.fieldViolations.map((v) => v.field);
    else if (err instanceof NotFoundError) err.code satisfies string;
    else if (err instanceof CorralError) err.details.map((d) => d.type);
    else if (err instanceof TransferChangedError) err.message;
  }
  client.close();
  void [health, tools, mode, firstLine, kinds, grep, patch, exit, state, final, listed, notBytes, written, up, skipped, callId, content];
}
