// The corral client: one gRPC channel to a daemon, sessions, typed tool RPCs and the bridge.
import { spawnSync } from 'node:child_process';
import { existsSync, realpathSync, statSync } from 'node:fs';
import { connect as netConnect } from 'node:net';
import { dirname, isAbsolute, join, resolve } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { corralPackage } from './proto.js';
import { fromGrpcError, CorralError, InvalidArgumentError, NotFoundError, PermissionDeniedError, UnavailableError } from './errors.js';
import { Files } from './files.js';
import { Processes } from './processes.js';
import { callOptions, dropUndefined, unary } from './rpc.js';

const asyncDispose = Symbol.asyncDispose ?? Symbol.for('Symbol.asyncDispose');
const dispose = Symbol.dispose ?? Symbol.for('Symbol.dispose');

const MODES = {
  'read-only': 'SANDBOX_MODE_READ_ONLY',
  'workspace-write': 'SANDBOX_MODE_WORKSPACE_WRITE',
  'danger-full-access': 'SANDBOX_MODE_DANGER_FULL_ACCESS',
};

const SHELL_TOOLS = {
  unified_exec: 'SHELL_TOOL_UNIFIED_EXEC',
  shell_command: 'SHELL_TOOL_SHELL_COMMAND',
  shell: 'SHELL_TOOL_SHELL',
  none: 'SHELL_TOOL_NONE',
};

const APPLY_PATCH_TOOLS = {
  freeform: 'APPLY_PATCH_TOOL_FREEFORM',
  function: 'APPLY_PATCH_TOOL_FUNCTION',
  none: 'APPLY_PATCH_TOOL_NONE',
};

const FORMATS = {
  responses: 'TOOL_FORMAT_RESPONSES',
  chat: 'TOOL_FORMAT_CHAT_COMPLETIONS',
  chat_completions: 'TOOL_FORMAT_CHAT_COMPLETIONS',
  'chat-completions': 'TOOL_FORMAT_CHAT_COMPLETIONS',
};

const READ_MODES = { slice: 'READ_MODE_SLICE', indentation: 'READ_MODE_INDENTATION' };

const APPROVAL_POLICIES = {
  untrusted: 'APPROVAL_POLICY_UNTRUSTED',
  'on-failure': 'APPROVAL_POLICY_ON_FAILURE',
  'on-request': 'APPROVAL_POLICY_ON_REQUEST',
  never: 'APPROVAL_POLICY_NEVER',
};

const NETWORK_MODES = {
  off: 'NETWORK_MODE_OFF',
  on: 'NETWORK_MODE_ON',
  proxy: 'NETWORK_MODE_PROXY',
};

/**
 * Domain rules as sent: an array of strings, or undefined when not given. Anything else (a lone
 * string among them) is a TypeError, never guessed at.
 */
function domainRules(rules, what) {
  if (rules === undefined || rules === null) return undefined;
  if (!Array.isArray(rules) || !rules.every((r) => typeof r === 'string')) {
    throw new TypeError(`${what} must be an array of rules (e.g. ['example.com', '*.example.com:443']), not ${JSON.stringify(rules)}`);
  }
  return rules;
}

const DECISIONS = {
  approved: 'APPROVAL_DECISION_APPROVED',
  approved_for_session: 'APPROVAL_DECISION_APPROVED_FOR_SESSION',
  denied: 'APPROVAL_DECISION_DENIED',
};

/**
 * An ApprovalDecision from `'approved'`, `'approved_for_session'`, `'denied'` (or the enum's
 * name); `true` approves once, `false`/`null`/`undefined` deny.
 */
function decisionValue(decision) {
  if (decision === true) return DECISIONS.approved;
  if (decision === false || decision === null || decision === undefined) return DECISIONS.denied;
  return enumValue(DECISIONS, decision, 'APPROVAL_DECISION_', 'approval decision');
}

/** An Invoke answer without the fields it does not carry (content items, approval, command). */
function invokeResult(res) {
  // `contentItems` (view_image's image) only when there are any.
  if (!res.contentItems?.length) delete res.contentItems;
  if (!res.approval) delete res.approval;
  // `command` (how a command the call ran ended) only for calls that ran one, as
  // `{exitCode}` or `{processId}` (still running).
  if (!res.command) {
    delete res.command;
  } else {
    const { exitCode, processId } = res.command;
    res.command = {};
    if (exitCode !== null && exitCode !== undefined) res.command.exitCode = exitCode;
    if (processId !== null && processId !== undefined) res.command.processId = processId;
  }
  return res;
}

/** The sandbox mode of a session opened without one: the safe one, the same in both clients. */
export const DEFAULT_MODE = 'read-only';

// grpc.health.v1 without its generated code: the request and the answer are one field each.
const HEALTH_CHECK = '/grpc.health.v1.Health/Check';
const HEALTH_STATUS = ['UNKNOWN', 'SERVING', 'NOT_SERVING', 'SERVICE_UNKNOWN'];

function varint(n) {
  const out = [];
  for (;;) {
    const byte = n & 0x7f;
    n >>>= 7;
    if (n) out.push(byte | 0x80);
    else return Buffer.from([...out, byte]);
  }
}

function healthRequest(service) {
  const raw = Buffer.from(service, 'utf8');
  return raw.length ? Buffer.concat([Buffer.from([0x0a]), varint(raw.length), raw]) : Buffer.alloc(0);
}

function healthStatus(data) {
  let status = 0;
  if (data[0] === 0x08) {
    for (let i = 1, shift = 0; i < data.length; i++, shift += 7) {
      status |= (data[i] & 0x7f) << shift;
      if (!(data[i] & 0x80)) break;
    }
  }
  return HEALTH_STATUS[status] ?? String(status);
}

const STREAMS = { OUTPUT_STREAM_STDOUT: 'stdout', OUTPUT_STREAM_STDERR: 'stderr' };

/**
 * @typedef {'read-only'|'workspace-write'|'danger-full-access'} SandboxMode
 * @typedef {{deadlineMs?: number, signal?: AbortSignal}} CallOptions
 * @typedef {{head: Buffer, tail: Buffer, totalBytes: number, droppedBytes: number}} CapturedOutput
 * @typedef {{exitCode: number, signal: number, durationSeconds: number, timedOut: boolean,
 *   truncated: boolean, sandboxDenied: boolean, stdout: CapturedOutput, stderr: CapturedOutput,
 *   combined: CapturedOutput, text: string, success: boolean, escalated: boolean}} ShellResult
 * @typedef {{type: 'begin', argv: string[], cwd: string}
 *   | {type: 'delta', seq: number, stream: 'stdout'|'stderr', data: Buffer}
 *   | {type: 'end', result: ShellResult}} ShellEvent
 * @typedef {{callId: string, output: string, success: boolean, contentItems?: object[]}} InvokeResult
 *   `contentItems`: only when the output is content items (view_image's image).
 */

/**
 * The largest message either side of a call may carry (64 MiB): gRPC's default receive limit
 * (4 MiB) is less than a big readFile answer or a full ReadProcess (up to 4 MiB of output plus
 * framing). `channelOptions` may set other limits.
 */
export const MAX_MESSAGE_BYTES = 64 * 1024 * 1024;

/** The environment variable naming the daemon's socket (any address form). */
export const SOCKET_ENV = 'CORRAL_SOCKET';
/** The system daemon's socket. */
export const SYSTEM_SOCKET = '/run/corral/corral.sock';
/** The environment variable a bearer token comes from when no `token` option is given. */
export const TOKEN_ENV = 'CORRAL_TOKEN';

function invalid(message) {
  return new InvalidArgumentError(message, { code: 'INVALID_ARGUMENT', grpcCode: grpc.status.INVALID_ARGUMENT });
}

/**
 * The token to send, by the `corral` CLI's rule (src/client/cli.rs, connect.rs): `token` if given,
 * else $CORRAL_TOKEN, for TCP targets only ($CORRAL_TOKEN is ignored for a Unix socket, where the
 * kernel says who calls; an explicit token there is an error), and only over TLS (a token over
 * plain TCP is an error, wherever it came from).
 * @returns {string | undefined}
 */
function bearerToken(token, { address, unix, secure }) {
  if (token && unix) {
    throw invalid(`the token option is for TCP addresses (tcp:HOST:PORT); ${address} is a Unix socket, where the kernel says who you are`);
  }
  if (!token && !unix) token = process.env[TOKEN_ENV] || undefined;
  if (!token) return undefined;
  if (!secure) {
    throw invalid(
      `a token (the token option or $${TOKEN_ENV}) is only sent over TLS, and ${address} is plain TCP: ` +
        "pass tls: { rootCerts } (the CA that signed the daemon's certificate) or tls: true",
    );
  }
  if (!/^[\x20-\x7e]+$/.test(token)) throw invalid(`the token (the token option or $${TOKEN_ENV}) has characters a header cannot carry`);
  return token;
}

/**
 * Why a Unix socket takes no connection — missing, refused, … — in a sentence, or null when it
 * does.
 * @param {string} path
 * @returns {Promise<string | null>}
 */
export function unixUnreachable(path) {
  const hint = 'is `corral serve` running? It prints the socket it listens on: pass that address or set $CORRAL_SOCKET';
  return new Promise((res) => {
    const sock = netConnect({ path });
    const timer = setTimeout(() => {
      sock.destroy();
      res(null);
    }, 2000);
    sock.once('connect', () => {
      clearTimeout(timer);
      sock.destroy();
      res(null);
    });
    sock.once('error', (err) => {
      clearTimeout(timer);
      if (err.code === 'ENOENT') res(`cannot connect to ${path}: no such socket (${hint})`);
      else if (err.code === 'ECONNREFUSED') {
        res(`cannot connect to ${path}: connection refused, nothing is listening there (a socket left behind by a daemon that is gone?); ${hint}`);
      } else res(`cannot connect to ${path}: ${err.message} (${hint})`);
    });
  });
}

/**
 * The daemon to call when no address is given: the socket rule shared with the `corral` CLI
 * (src/daemon/socket.rs). $CORRAL_SOCKET, else $XDG_RUNTIME_DIR/corral/corral.sock when not root
 * and a daemon is there, else the system daemon. Never a /tmp location another user could create.
 */
export function defaultTarget() {
  if (process.env[SOCKET_ENV]) return process.env[SOCKET_ENV];
  if (process.geteuid?.() !== 0) {
    const runtime = process.env.XDG_RUNTIME_DIR;
    if (runtime) {
      const own = join(runtime, 'corral', 'corral.sock');
      if (existsSync(own)) return `unix:${own}`;
    }
  }
  return `unix:${SYSTEM_SOCKET}`;
}

function describeUid(uid) {
  const r = spawnSync('getent', ['passwd', String(uid)], { encoding: 'utf8' });
  const name = r.status === 0 ? r.stdout.split(':')[0] : '';
  return name ? `uid ${uid} (${name})` : `uid ${uid}`;
}

function refuse(message) {
  return new PermissionDeniedError(message, { code: 'PERMISSION_DENIED', grpcCode: grpc.status.PERMISSION_DENIED });
}

/**
 * Refuses a Unix socket another user could have planted (throws PermissionDeniedError): its
 * directory must be owned by root or `uid` (default: this process's) and not writable by group or
 * others, and the socket itself owned by root or `uid`. A missing socket passes (connecting
 * reports it). The same check as the `corral` CLI.
 * @param {string} path
 * @param {number} [uid]
 */
export function checkSocket(path, uid = process.geteuid?.() ?? 0) {
  let sock;
  try {
    sock = statSync(path);
  } catch (err) {
    if (err.code === 'ENOENT') return;
    throw err;
  }
  // The directory named, and the one the socket really lives in (a symlink in a private
  // directory may lead to a socket in a shared one, where another user can replace it).
  for (const dir of [dirname(path), dirname(realpathSync(path))]) {
    const st = statSync(dir);
    const mode = st.mode & 0o7777;
    if ((st.uid !== 0 && st.uid !== uid) || (mode & 0o022) !== 0) {
      throw refuse(
        `refusing socket ${path}: its directory ${dir} is owned by ${describeUid(st.uid)} with mode ` +
          `${mode.toString(8).padStart(4, '0')}; a corral socket's directory must be owned by root or ` +
          `${describeUid(uid)} and not writable by group or others, or another user could put an ` +
          'impostor daemon there. Use a private directory (e.g. $XDG_RUNTIME_DIR/corral or /run/corral)',
      );
    }
  }
  if (sock.uid !== 0 && sock.uid !== uid) {
    throw refuse(
      `refusing socket ${path}: it is owned by ${describeUid(sock.uid)}, not by root or ` +
        `${describeUid(uid)}; it may be an impostor`,
    );
  }
}

/**
 * Maps corral's address forms to a grpc-js target: a socket path or `unix:PATH` → `unix:/abs`,
 * `tcp:HOST:PORT` → `HOST:PORT`; anything else (`HOST:PORT`, `dns:…`) passes through.
 * @param {string} address
 * @returns {{target: string, unix: boolean}}
 */
export function parseTarget(address) {
  if (address.startsWith('unix://')) return { target: address, unix: true };
  if (address.startsWith('unix:')) return { target: `unix:${resolve(address.slice(5))}`, unix: true };
  if (address.startsWith('tcp:')) return { target: address.slice(4), unix: false };
  if (isAbsolute(address) || address.startsWith('.') || !address.includes(':')) {
    return { target: `unix:${resolve(address)}`, unix: true };
  }
  return { target: address, unix: false };
}

function enumValue(table, value, prefix, what) {
  if (value === undefined || value === null) return undefined;
  if (table[value]) return table[value];
  if (typeof value === 'string' && value.startsWith(prefix)) return value;
  throw new TypeError(`unknown ${what}: ${value} (expected one of ${Object.keys(table).join(', ')})`);
}

function optionalBool(value, what) {
  if (value === undefined || value === null) return undefined;
  if (typeof value !== 'boolean') throw new TypeError(`${what} must be a boolean, not ${value}`);
  return value;
}

function shellRequest(sessionId, command, opts = {}) {
  const req = {
    sessionId,
    workdir: opts.workdir,
    timeoutMs: opts.timeoutMs,
    login: opts.login,
    withEscalatedPermissions: opts.withEscalatedPermissions,
    justification: opts.justification,
    truncation: opts.truncation,
  };
  if (Array.isArray(command)) req.command = command;
  else if (typeof command === 'string') req.script = command;
  else throw new TypeError('shell: command must be an argv array or a script string');
  return dropUndefined(req);
}

/** A connection to a corral daemon. */
export class Client {
  /**
   * @param {string} [address] socket path, `unix:PATH`, `tcp:HOST:PORT` or `HOST:PORT`
   *   (default: defaultTarget()); a Unix socket must pass checkSocket (PermissionDeniedError otherwise)
   * @param {{tls?: boolean | {rootCerts?: Buffer, privateKey?: Buffer, certChain?: Buffer, serverName?: string},
   *   credentials?: grpc.ChannelCredentials, token?: string, channelOptions?: object, deadlineMs?: number}} [options]
   *   `tls`: use TLS for a TCP address (`true` for the system roots); `credentials` overrides it;
   *   `token`: a bearer token the daemon maps to a local user (its [[tokens]]), sent as
   *   `authorization: Bearer TOKEN` (default: $CORRAL_TOKEN; TCP with TLS only, as for the CLI);
   *   `deadlineMs`: default per-call deadline. Messages of up to MAX_MESSAGE_BYTES (64 MiB) are
   *   sent and received unless `channelOptions` says otherwise.
   */
  constructor(address = defaultTarget(), options = {}) {
    const { target, unix } = parseTarget(address);
    this._unixPath = unix ? target.replace(/^unix:(\/\/)?/, '') : undefined;
    // Never talk to an impostor (the same rule as the corral CLI).
    if (unix) checkSocket(target.replace(/^unix:(\/\/)?/, ''));
    let credentials = options.credentials;
    const channelOptions = {
      'grpc.max_receive_message_length': MAX_MESSAGE_BYTES,
      'grpc.max_send_message_length': MAX_MESSAGE_BYTES,
      ...(options.channelOptions ?? {}),
    };
    if (!credentials) {
      if (options.tls && !unix) {
        const tls = options.tls === true ? {} : options.tls;
        credentials = grpc.credentials.createSsl(tls.rootCerts ?? null, tls.privateKey ?? null, tls.certChain ?? null);
        if (tls.serverName) channelOptions['grpc.ssl_target_name_override'] = tls.serverName;
      } else {
        credentials = grpc.credentials.createInsecure();
      }
    }
    const secure = typeof credentials._isSecure === 'function' ? credentials._isSecure() : Boolean(options.credentials);
    const token = bearerToken(options.token, { address, unix, secure });
    if (token) {
      const bearer = grpc.credentials.createFromMetadataGenerator((_params, callback) => {
        const metadata = new grpc.Metadata();
        metadata.set('authorization', `Bearer ${token}`);
        callback(null, metadata);
      });
      credentials = credentials.compose(bearer);
    }
    const pkg = corralPackage();
    this.target = target;
    this.defaultDeadlineMs = options.deadlineMs;
    this._sessions = new pkg.Sessions(target, credentials, channelOptions);
    const shared = { ...channelOptions, channelOverride: this._sessions.getChannel() };
    this._tools = new pkg.Tools(target, credentials, shared);
    this._bridge = new pkg.Bridge(target, credentials, shared);
    this._processes = new pkg.Processes(target, credentials, shared);
    this._files = new pkg.Files(target, credentials, shared);
  }

  _opts(opts) {
    return { deadlineMs: this.defaultDeadlineMs, explain: (err) => this._explain(err), ...(opts ?? {}) };
  }

  /**
   * `err`, or for an UNAVAILABLE Unix socket that is missing or refuses connections, the same
   * error saying which (grpc-js's own text says only `No connection established`).
   * @param {Error} err
   * @returns {Promise<Error>}
   */
  async _explain(err) {
    if (!(err instanceof CorralError) || err.code !== 'UNAVAILABLE' || !this._unixPath) return err;
    const why = await unixUnreachable(this._unixPath);
    if (!why) return err;
    return new UnavailableError(why, { code: err.code, grpcCode: err.grpcCode, details: err.details, metadata: err.metadata, cause: err });
  }

  /**
   * Resolves once the channel is connected (rejects after timeoutMs).
   * @param {number} [timeoutMs]
   */
  waitForReady(timeoutMs = 10_000) {
    return new Promise((res, rej) => {
      this._sessions.waitForReady(new Date(Date.now() + timeoutMs), (err) =>
        err
          ? this._explain(new UnavailableError(`corral at ${this.target} not ready: ${err.message}`, { code: 'UNAVAILABLE', grpcCode: grpc.status.UNAVAILABLE, cause: err })).then(rej)
          : res(),
      );
    });
  }

  /**
   * The grpc.health.v1 status of the daemon (`service` empty) or one of its services:
   * `'SERVING'`, `'NOT_SERVING'`, `'SERVICE_UNKNOWN'`, `'UNKNOWN'`.
   * @param {string} [service]
   * @param {CallOptions} [opts]
   * @returns {Promise<string>}
   */
  health(service = '', opts) {
    const stub = { check: (req, md, o, cb) => this._sessions.makeUnaryRequest(HEALTH_CHECK, (b) => b, (b) => b, req, md, o, cb) };
    return unary(stub, 'check', healthRequest(service), this._opts(opts)).then(healthStatus);
  }

  /** The daemon's version, tools and sandbox layers. @param {CallOptions} [opts] */
  capabilities(opts) {
    return unary(this._sessions, 'getCapabilities', {}, this._opts(opts));
  }

  /**
   * Opens a session.
   * @param {{cwd?: string, mode?: SandboxMode, writableRoots?: string[], networkAccess?: boolean,
   *   excludeTmpdirEnvVar?: boolean, excludeSlashTmp?: boolean, env?: Record<string, string>,
   *   profile?: string, shellTool?: 'unified_exec'|'shell_command'|'shell'|'none',
   *   applyPatchTool?: 'freeform'|'function'|'none', updatePlan?: boolean, viewImage?: boolean,
   *   noImageInput?: boolean, backgroundTerminalMaxTimeoutMs?: number,
   *   approvalPolicy?: 'untrusted'|'on-failure'|'on-request'|'never', approvalTimeoutMs?: number}} [settings]
   *   `cwd` defaults to process.cwd(), `mode` to `read-only`; `env` is merged over the daemon's default
   *   environment (HOME, USER, LOGNAME, SHELL from the user's passwd entry, a system PATH,
   *   LANG=C.UTF-8), entry by entry.
   *   The tool set: `shellTool` (default unified exec, as in Codex), `applyPatchTool` (default
   *   freeform), `updatePlan`/`viewImage` (default offered; `false` leaves them out);
   *   `noImageInput`: the model takes no images (view_image answers Codex's refusal);
   *   `backgroundTerminalMaxTimeoutMs`: the longest an empty write_stdin poll waits (0: 300 000).
   *   `approvalPolicy` (unset: nothing is asked) makes some command calls come back with an
   *   `approval` request instead of a result (see decideApproval); a request waits
   *   `approvalTimeoutMs` (default ten minutes).
   *   `network`: how commands reach the network, `'off'`, `'on'` or `'proxy'` (unset:
   *   `networkAccess` decides, as before). A `'proxy'` session's commands reach only the hosts
   *   `allowDomains` names (`example.com`, `*.example.com`, either with `:PORT` or `:PORT,PORT`),
   *   through corral's egress proxy (HTTP_PROXY etc. in their environment); `denyDomains` wins
   *   over an allow rule; setNetworkRules replaces them later. The daemon judges the combination:
   *   `networkAccess: true` with `'off'` or `'proxy'`, rules without `'proxy'`, a malformed rule
   *   reject with InvalidArgumentError, its `fieldViolations` naming the field.
   * @param {CallOptions} [opts]
   * @returns {Promise<Session>}
   */
  async openSession(settings = {}, opts) {
    const req = dropUndefined({
      cwd: resolve(settings.cwd ?? process.cwd()),
      mode: enumValue(MODES, settings.mode ?? DEFAULT_MODE, 'SANDBOX_MODE_', 'sandbox mode'),
      writableRoots: settings.writableRoots,
      networkAccess: settings.networkAccess,
      excludeTmpdirEnvVar: settings.excludeTmpdirEnvVar,
      excludeSlashTmp: settings.excludeSlashTmp,
      env: settings.env,
      profile: settings.profile || undefined,
      // The session's tool set (unified exec by default, as in Codex); tools() lists exactly it.
      shellTool: enumValue(SHELL_TOOLS, settings.shellTool, 'SHELL_TOOL_', 'shell tool'),
      applyPatchTool: enumValue(APPLY_PATCH_TOOLS, settings.applyPatchTool, 'APPLY_PATCH_TOOL_', 'apply_patch tool'),
      updatePlan: optionalBool(settings.updatePlan, 'updatePlan'),
      viewImage: optionalBool(settings.viewImage, 'viewImage'),
      noImageInput: optionalBool(settings.noImageInput, 'noImageInput'),
      backgroundTerminalMaxTimeoutMs: settings.backgroundTerminalMaxTimeoutMs,
      approvalPolicy: enumValue(APPROVAL_POLICIES, settings.approvalPolicy, 'APPROVAL_POLICY_', 'approval policy'),
      approvalTimeoutMs: settings.approvalTimeoutMs,
      // Sent as given: the daemon alone judges the network settings (see above).
      networkMode: enumValue(NETWORK_MODES, settings.network, 'NETWORK_MODE_', 'network mode'),
      allowDomains: domainRules(settings.allowDomains, 'allowDomains'),
      denyDomains: domainRules(settings.denyDomains, 'denyDomains'),
    });
    const res = await unary(this._sessions, 'openSession', req, this._opts(opts));
    return new Session(this, res.sessionId, {
      writableRoots: res.writableRoots,
      skippedWritableRoots: res.skippedWritableRoots,
    });
  }

  /**
   * Replaces a `network: 'proxy'` session's allow and deny rules (openSession's syntax; none
   * allowed: nothing is reachable). New connections follow them; one already open keeps what let
   * it in. A session of another network mode: FailedPreconditionError; a malformed rule:
   * InvalidArgumentError whose `fieldViolations` name it as the proto does (`allow_domains[0]`),
   * and the rules stay as they were.
   * @param {{sessionId: string, allowDomains?: string[], denyDomains?: string[]} & CallOptions} call
   * @returns {Promise<void>}
   */
  async setNetworkRules({ sessionId, allowDomains = [], denyDomains = [], ...opts }) {
    const req = {
      sessionId,
      allowDomains: domainRules(allowDomains, 'allowDomains'),
      denyDomains: domainRules(denyDomains, 'denyDomains'),
    };
    await unary(this._sessions, 'setNetworkRules', req, this._opts(opts));
  }

  /**
   * Attaches to a session opened earlier (by this or another client, e.g. another program):
   * nothing is sent, an unknown id fails on the first call (NotFoundError).
   * @param {string} sessionId
   */
  session(sessionId) {
    return new Session(this, sessionId);
  }

  /**
   * The model-facing tool definitions, parsed: the value for the API request's `tools` field.
   * @param {'responses'|'chat'} [format]
   * @param {{sessionId?: string, exclude?: string[]} & CallOptions} [opts]
   * @returns {Promise<object[]>}
   */
  async listTools(format = 'responses', opts = {}) {
    const req = dropUndefined({
      format: enumValue(FORMATS, format, 'TOOL_FORMAT_', 'tool format'),
      sessionId: opts.sessionId,
      exclude: opts.exclude,
    });
    const res = await unary(this._bridge, 'listTools', req, this._opts(opts));
    return JSON.parse(res.toolsJson);
  }

  /**
   * Runs one model tool call through the bridge.
   * @param {{sessionId: string, name: string, arguments?: string | object, callId?: string, freeform?: boolean} & CallOptions} call
   * @returns {Promise<InvokeResult>}
   */
  invoke({ sessionId, name, arguments: args = '{}', callId = '', freeform = false, ...opts }) {
    if (typeof args !== 'string') {
      if (freeform) throw new TypeError('invoke: freeform arguments must be a string');
      args = JSON.stringify(args);
    }
    return unary(this._bridge, 'invoke', { sessionId, name, arguments: args, callId, freeform }, this._opts(opts)).then(
      invokeResult,
    );
  }

  /**
   * Answers an approval request (an `approval` on an invoke, shell or startProcess answer) with
   * `'approved'`, `'approved_for_session'` or `'denied'`; resolves to the completed call:
   * `{result: 'invoke', invoke}`, `{result: 'shell', shell}` or `{result: 'startProcess',
   * startProcess}` (which may carry a new request). Unknown id: NotFoundError; decided already:
   * FailedPreconditionError; expired: DeadlineExceededError (give the model the request's
   * `rejectedOutput`).
   * @param {{sessionId: string, approvalId: string, decision: string | boolean} & CallOptions} call
   */
  async decideApproval({ sessionId, approvalId, decision, ...opts }) {
    const req = { sessionId, approvalId, decision: decisionValue(decision) };
    const res = await unary(this._bridge, 'decideApproval', req, this._opts(opts));
    const out = { result: res.result };
    if (res.result === 'invoke') out.invoke = invokeResult(res.invoke);
    else if (res.result) out[res.result] = res[res.result];
    return out;
  }

  /**
   * Whether the `untrusted` policy would run this argv without asking (it is known safe).
   * @param {string[]} command
   * @param {CallOptions} [opts]
   * @returns {Promise<boolean>}
   */
  async classifyCommand(command, opts) {
    const res = await unary(this._bridge, 'classifyCommand', { command }, this._opts(opts));
    return res.knownSafe;
  }

  /**
   * Closes a session by id; NotFoundError if it is unknown, closed or expired.
   * @param {string} sessionId
   * @param {CallOptions} [opts]
   */
  async closeSession(sessionId, opts) {
    await unary(this._sessions, 'closeSession', { sessionId }, this._opts(opts));
  }

  /** Closes the channel (sessions stay open on the daemon until closed or expired). */
  close() {
    this._files.close();
    this._tools.close();
    this._bridge.close();
    this._processes.close();
    this._sessions.close();
  }

  [dispose]() {
    this.close();
  }

  async [asyncDispose]() {
    this.close();
  }
}

/** An open session: every tool call runs in its cwd and sandbox; `processes` are its long-lived processes. */
export class Session {
  /**
   * @param {Client} client
   * @param {string} id
   * @param {{writableRoots?: string[], skippedWritableRoots?: string[]}} [info]
   */
  constructor(client, id, info = {}) {
    this.client = client;
    this.id = id;
    this.writableRoots = info.writableRoots ?? [];
    this.skippedWritableRoots = info.skippedWritableRoots ?? [];
    this.closed = false;
    /** The session's long-lived processes. */
    this.processes = new Processes(this);
    /** Byte-exact file transfer: read, write, upload, download. */
    this.files = new Files(this);
  }

  /**
   * Reads a file with 1-indexed line numbers.
   * @param {string} filePath absolute, or relative to the session cwd
   * @param {{offset?: number, limit?: number, mode?: 'slice'|'indentation',
   *   indentation?: {anchorLine?: number, maxLevels?: number, includeSiblings?: boolean, includeHeader?: boolean, maxLines?: number}} & CallOptions} [opts]
   * @returns {Promise<{path: string, lines: {number: number, text: string}[], text: string}>}
   */
  readFile(filePath, opts = {}) {
    const { offset, limit, mode, indentation, ...call } = opts;
    const req = dropUndefined({
      sessionId: this.id,
      filePath,
      offset,
      limit,
      mode: enumValue(READ_MODES, mode, 'READ_MODE_', 'read mode'),
      indentation,
    });
    return unary(this.client._tools, 'readFile', req, this.client._opts(call));
  }

  /**
   * Lists a directory breadth-first.
   * @param {string} dirPath
   * @param {{offset?: number, limit?: number, depth?: number} & CallOptions} [opts]
   * @returns {Promise<{absolutePath: string, entries: {relativePath: string, name: string, depth: number, kind: string}[], moreEntries: boolean, text: string}>}
   */
  listDir(dirPath, opts = {}) {
    const { offset, limit, depth, ...call } = opts;
    const req = dropUndefined({ sessionId: this.id, dirPath, offset, limit, depth });
    return unary(this.client._tools, 'listDir', req, this.client._opts(call));
  }

  /**
   * Finds files whose contents match a regex, newest first.
   * @param {string} pattern
   * @param {{include?: string, path?: string, limit?: number} & CallOptions} [opts]
   * @returns {Promise<{matches: {path: string, modifiedUnixSeconds: number, modifiedNanos: number}[], truncated: boolean, text: string}>}
   */
  grepFiles(pattern, opts = {}) {
    const { include, path, limit, ...call } = opts;
    const req = dropUndefined({ sessionId: this.id, pattern, include, path, limit });
    return unary(this.client._tools, 'grepFiles', req, this.client._opts(call));
  }

  /**
   * Applies a patch (`*** Begin Patch` … `*** End Patch`) in the sandbox: `changes` per hunk,
   * `text` as Codex returns it.
   * @param {string} patch
   * @param {CallOptions} [opts]
   * @returns {Promise<{changes: {path: string, kind: string, movedFrom: string, unifiedDiff: string, overwritten: boolean}[], text: string, warnings: string[]}>}
   */
  applyPatch(patch, opts) {
    return unary(this.client._tools, 'applyPatch', { sessionId: this.id, patch }, this.client._opts(opts));
  }

  /**
   * Runs a command: an argv array (execvp) or a script string (the user's shell).
   * @param {string[] | string} command
   * @param {{workdir?: string, timeoutMs?: number, login?: boolean, withEscalatedPermissions?: boolean,
   *   justification?: string, truncation?: {bytes: number} | {tokens: number}} & CallOptions} [opts]
   * @returns {Promise<ShellResult>}
   */
  shell(command, opts = {}) {
    return unary(this.client._tools, 'shell', shellRequest(this.id, command, opts), this.client._opts(opts));
  }

  /**
   * The same as shell(), streaming: a `begin` event, output `delta`s in arrival order, an `end`
   * event with the result. Breaking out of the loop cancels the command.
   * @param {string[] | string} command
   * @param {Parameters<Session['shell']>[1]} [opts]
   * @returns {AsyncGenerator<ShellEvent>}
   */
  async *shellStream(command, opts = {}) {
    const request = shellRequest(this.id, command, opts);
    const call = this.client._tools.shellStream(request, new grpc.Metadata(), callOptions(this.client._opts(opts)));
    const onAbort = () => call.cancel();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    let finished = false;
    try {
      for await (const ev of call) {
        if (ev.event === 'begin') yield { type: 'begin', argv: ev.begin.argv, cwd: ev.begin.cwd };
        else if (ev.event === 'delta') {
          const d = ev.delta;
          yield { type: 'delta', seq: d.seq, stream: STREAMS[d.stream] ?? 'unspecified', data: d.data };
        } else if (ev.event === 'end') yield { type: 'end', result: ev.end };
        else if (ev.event === 'approval') yield { type: 'approval', request: ev.approval };
      }
      finished = true;
    } catch (err) {
      finished = true;
      throw await this.client._explain(fromGrpcError(err));
    } finally {
      opts.signal?.removeEventListener('abort', onAbort);
      if (!finished) call.cancel();
    }
  }

  /**
   * Model-facing tool definitions for this session.
   * @param {'responses'|'chat'} [format]
   * @param {{exclude?: string[]} & CallOptions} [opts]
   */
  listTools(format = 'responses', opts = {}) {
    return this.client.listTools(format, { ...opts, sessionId: this.id });
  }

  /**
   * Runs one model tool call through the bridge: exactly what Codex would send back to the model.
   * @param {string} name the tool name the model called
   * @param {string | object} [args] the JSON arguments (object or string), or the raw freeform input
   * @param {{callId?: string, freeform?: boolean} & CallOptions} [opts]
   * @returns {Promise<InvokeResult>}
   */
  invoke(name, args = '{}', opts = {}) {
    return this.client.invoke({ ...opts, sessionId: this.id, name, arguments: args });
  }

  /**
   * Answers one of this session's approval requests; see Client.decideApproval.
   * @param {string} approvalId
   * @param {string | boolean} decision
   * @param {CallOptions} [opts]
   */
  decideApproval(approvalId, decision, opts = {}) {
    return this.client.decideApproval({ ...opts, sessionId: this.id, approvalId, decision });
  }

  /**
   * Replaces this `network: 'proxy'` session's rules; see Client.setNetworkRules.
   * @param {{allowDomains?: string[], denyDomains?: string[]} & CallOptions} [rules]
   * @returns {Promise<void>}
   */
  setNetworkRules(rules = {}) {
    return this.client.setNetworkRules({ ...rules, sessionId: this.id });
  }

  /** Closes the session (idempotent; an already expired session counts as closed). */
  async close(opts) {
    if (this.closed) return;
    this.closed = true;
    try {
      await this.client.closeSession(this.id, opts);
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }

  async [asyncDispose]() {
    await this.close();
  }
}
