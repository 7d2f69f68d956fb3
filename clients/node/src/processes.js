// Long-lived processes of a session: the corral.v1.Processes service.
//
// A process runs in the session's sandbox, with pipes or a PTY, and keeps its output (1 MiB: the
// first and the last 512 KiB) in sequence-numbered chunks, so a reader can stop and resume from a
// cursor — even on a new connection — and learns exactly how many bytes fell out of that window.
// Processes share the session's table with the model's exec_command/write_stdin.
import { NotFoundError } from './errors.js';
import { dropUndefined, unary } from './rpc.js';

// A cursor past every chunk: a read from it returns no output and only waits for the state.
// (A JavaScript number stays exact up to 2^53; a larger one would reach the daemon rounded.)
const PAST_THE_END = Number.MAX_SAFE_INTEGER;
// Longest wait the daemon accepts for one read (ReadProcessRequest.wait_ms).
const MAX_WAIT_MS = 30_000;

/**
 * @typedef {import('./client.js').Session} Session
 * @typedef {{deadlineMs?: number, signal?: AbortSignal}} CallOptions
 * @typedef {{running: boolean, exitCode: number|null, closed: boolean, outputBytes: number}} ProcessState
 *   `running`: the leader has not exited; `exitCode` once it exited (128 + N for death by signal N);
 *   `closed`: the output is closed and the whole tree is gone (no more output); `outputBytes` so far.
 * @typedef {{seq: number, offset: number, data: Buffer, missed?: number|null}} OutputChunk
 *   `offset`: of `data` in the whole output. `missed` (follow() only): bytes lost right before this
 *   chunk (0: none; null: some, but the follower was resumed from a bare seq without an offset).
 * @typedef {{chunks: OutputChunk[], gap: boolean, more: boolean, lastSeq: number|null, state: ProcessState}} ReadResult
 * @typedef {{seq: number|null, offset: number|null}} Cursor
 *   `seq`: the last sequence number received (null: none, read from the start); `offset`: the end
 *   of the bytes received in the whole output (null: unknown). Plain data: store it anywhere.
 * @typedef {{id: number, command: string[], tty: boolean, state: ProcessState, escalated: boolean}} ProcessInfo
 */

function toState(s = {}) {
  return { running: !!s.running, exitCode: s.exitCode ?? null, closed: !!s.closed, outputBytes: s.outputBytes ?? 0 };
}

function cursorSeq(afterSeq) {
  const seq = afterSeq !== null && typeof afterSeq === 'object' ? afterSeq.seq : afterSeq;
  if (seq === undefined || seq === null) return undefined;
  // Numbers above 2^53 would not reach the daemon exactly (and 2^64 - 1 would overflow its
  // `after_seq + 1`); no process has that many chunks.
  if (!Number.isSafeInteger(seq) || seq < 0) {
    throw new RangeError(`afterSeq must be a non-negative safe integer, not ${seq}`);
  }
  return seq;
}

function signalName(sig) {
  if (typeof sig === 'string') return sig;
  if (Number.isInteger(sig)) return String(sig);
  throw new TypeError(`signal must be a name ('TERM', 'SIGINT', …) or a number, not ${sig}`);
}

/** `session.processes`: start, attach to and list the session's processes. */
export class Processes {
  /** @param {Session} session */
  constructor(session) {
    this.session = session;
  }

  /**
   * Starts a process; resolves as soon as it runs. Give exactly one of `argv` (run directly,
   * looked up on PATH) and `script` (run by the session's shell). `workdir` is relative to the
   * session's cwd. `tty` gives it a PTY (`rows`/`cols`, 0 = 24×80); otherwise stdin is a pipe you
   * may write to and close, and stdout and stderr are interleaved as they arrive. `env` adds to the
   * session's environment. `escalated` runs it outside the sandbox, when the policy allows.
   * @param {{argv?: string[], script?: string, workdir?: string, tty?: boolean, rows?: number,
   *   cols?: number, env?: Record<string, string>, escalated?: boolean} & CallOptions} options
   * @returns {Promise<Process>}
   */
  async start(options = {}) {
    const { argv, script, workdir, tty = false, rows = 0, cols = 0, env, escalated = false, ...call } = options;
    if (typeof argv === 'string') throw new TypeError('processes.start: argv is an array; pass a shell script as `script`');
    if ((argv === undefined) === (script === undefined)) {
      throw new TypeError('processes.start: give exactly one of argv (an array) and script');
    }
    const req = dropUndefined({
      sessionId: this.session.id,
      argv: argv === undefined ? undefined : { args: argv },
      script,
      workdir,
      tty,
      rows,
      cols,
      env,
      withEscalatedPermissions: escalated,
    });
    const client = this.session.client;
    const res = await unary(client._processes, 'startProcess', req, client._opts(call));
    return new Process(this.session, res.processId, { tty });
  }

  /**
   * A handle on a process started earlier (by this or another client, or by the model's
   * exec_command). Nothing is sent: an unknown id fails on the first call (NotFoundError).
   * @param {number} processId
   */
  attach(processId) {
    return new Process(this.session, processId);
  }

  /**
   * The session's processes, by id.
   * @param {CallOptions} [opts]
   * @returns {Promise<ProcessInfo[]>}
   */
  async list(opts) {
    const client = this.session.client;
    const res = await unary(client._processes, 'listProcesses', { sessionId: this.session.id }, client._opts(opts));
    return res.processes.map((p) => ({
      id: p.processId,
      command: p.command,
      tty: p.tty,
      state: toState(p.state),
      escalated: p.escalated,
    }));
  }
}

/** A process of a session (from processes.start() or processes.attach()). */
export class Process {
  /**
   * @param {Session} session
   * @param {number} id
   * @param {{tty?: boolean}} [info]
   */
  constructor(session, id, info = {}) {
    this.session = session;
    this.id = id;
    this.tty = info.tty;
  }

  _call(method, request, opts) {
    const client = this.session.client;
    return unary(client._processes, method, { sessionId: this.session.id, processId: this.id, ...request }, client._opts(opts));
  }

  /**
   * Writes to its stdin (the PTY, or the stdin pipe); a string is sent as UTF-8. At most 1 MiB per
   * call. `closeStdin` then closes the pipe (pipes only; on a PTY write '\x04').
   * @param {Buffer | Uint8Array | string} data
   * @param {{closeStdin?: boolean} & CallOptions} [opts]
   */
  async write(data, opts = {}) {
    const { closeStdin = false, ...call } = opts;
    await this._call('writeProcess', { data: Buffer.from(data), closeStdin }, call);
  }

  /** Closes its stdin pipe (end of file for the process; pipes only). @param {CallOptions} [opts] */
  closeStdin(opts = {}) {
    return this.write(Buffer.alloc(0), { ...opts, closeStdin: true });
  }

  /**
   * The retained output after the cursor `afterSeq` (the previous read's `lastSeq`, or a Cursor;
   * absent: from the first retained byte), waiting up to `waitMs` (at most 30 000) for some when
   * there is none yet, at most `maxBytes` of it (0: 1 MiB; at most 4 MiB; the first chunk comes
   * whole), and the process's state. `gap`: output after the cursor fell out of the retention
   * window (the offsets say how much); `more`: the read stopped at maxBytes, read again at once.
   * @param {{afterSeq?: number|Cursor|null, waitMs?: number, maxBytes?: number} & CallOptions} [opts]
   * @returns {Promise<ReadResult>}
   */
  async read(opts = {}) {
    const { afterSeq, waitMs = 0, maxBytes = 0, ...call } = opts;
    const req = dropUndefined({ afterSeq: cursorSeq(afterSeq), waitMs, maxBytes });
    // A waiting read must not hit the client's default deadline while it waits.
    const deadline = this.session.client.defaultDeadlineMs;
    if (call.deadlineMs === undefined && deadline) call.deadlineMs = Math.max(deadline, waitMs + 10_000);
    const res = await this._call('readProcess', req, call);
    return {
      chunks: res.chunks.map((c) => ({ seq: c.seq, offset: c.offset, data: c.data })),
      gap: res.gap,
      more: res.more,
      lastSeq: res.lastSeq ?? null,
      state: toState(res.state),
    };
  }

  /**
   * An async iterator of the output's chunks from the cursor `afterSeq` (absent: the start) until
   * the output closes; see Follower. `waitMs` is how long each read waits for new output.
   * @param {{afterSeq?: number|Cursor|null, waitMs?: number, maxBytes?: number}} [opts]
   */
  follow(opts = {}) {
    return new Follower(this, opts);
  }

  /**
   * Waits until the process and its whole tree are gone (`state.closed`), or `timeoutMs`
   * (default: no limit); resolves to the latest state. Reads no output.
   * @param {{timeoutMs?: number}} [opts]
   * @returns {Promise<ProcessState>}
   */
  async wait(opts = {}) {
    const deadline = opts.timeoutMs === undefined ? undefined : Date.now() + opts.timeoutMs;
    for (;;) {
      const left = deadline === undefined ? MAX_WAIT_MS : Math.min(MAX_WAIT_MS, Math.max(0, deadline - Date.now()));
      const { state } = await this.read({ afterSeq: PAST_THE_END, waitMs: Math.round(left) });
      if (state.closed || (deadline !== undefined && Date.now() >= deadline)) return state;
    }
  }

  /**
   * Sets its PTY's size (1..1000 each; TTY processes only).
   * @param {number} rows
   * @param {number} cols
   * @param {CallOptions} [opts]
   */
  async resize(rows, cols, opts) {
    await this._call('resizeProcess', { rows, cols }, opts);
  }

  /**
   * Sends a signal to its process group: a name with or without SIG ('INT', 'SIGTERM') or a
   * number. Allowed: HUP, INT, QUIT, KILL, USR1, USR2, TERM, CONT, STOP, TSTP, WINCH.
   * @param {string|number} sig
   * @param {CallOptions} [opts]
   */
  async signal(sig, opts) {
    await this._call('signalProcess', { signal: signalName(sig) }, opts);
  }

  /**
   * Kills its whole tree, waits until it is gone, and forgets the process (later calls naming it
   * are NotFoundError); resolves to its final state.
   * @param {CallOptions} [opts]
   * @returns {Promise<ProcessState>}
   */
  async terminate(opts) {
    const res = await this._call('terminateProcess', {}, opts);
    return toState(res.state);
  }

  /** `await using proc = await session.processes.start(…)`: terminated at the end of the scope. */
  async [Symbol.asyncDispose ?? Symbol.for('Symbol.asyncDispose')]() {
    try {
      await this.terminate();
    } catch (err) {
      if (!(err instanceof NotFoundError)) throw err;
    }
  }
}

/**
 * Iterates a process's output chunk by chunk until the output closes (`process.follow()`), with
 * `for await`.
 *
 * Resuming: `cursor` covers exactly the chunks yielded so far. `break` out of the loop at any time
 * and later iterate the same follower again, or pass the cursor to `process.follow({ afterSeq:
 * cursor })` — on any client, even after this one is closed
 * (`client.session(id).processes.attach(processId)`). Nothing is repeated and nothing inside the
 * retention window is lost.
 *
 * Gaps are reported, not thrown: when output after the cursor fell out of the retention window
 * (1 MiB: the first and the last 512 KiB), the next chunk's `missed` is the exact number of bytes
 * lost right before it (from the offsets), and `missedBytes` adds up this follower's losses. The
 * data yielded plus `missedBytes` is always the whole output after the starting cursor. `state` is
 * the process's state as of the last read.
 */
export class Follower {
  /**
   * @param {Process} process
   * @param {{afterSeq?: number|Cursor|null, waitMs?: number, maxBytes?: number}} [opts]
   */
  constructor(process, opts = {}) {
    const { afterSeq, waitMs = 1000, maxBytes = 0 } = opts;
    let seq = null;
    let offset = 0;
    if (afterSeq !== null && typeof afterSeq === 'object') {
      seq = afterSeq.seq ?? null;
      offset = afterSeq.offset ?? (seq === null ? 0 : null);
    } else if (afterSeq !== undefined && afterSeq !== null) {
      seq = afterSeq;
      offset = null;
    }
    if (seq !== null) cursorSeq(seq);
    this.process = process;
    this.waitMs = waitMs;
    this.maxBytes = maxBytes;
    this._seq = seq;
    this._offset = offset;
    this._pending = [];
    // Resumed from a bare seq (no offset) and the first read says output right after the cursor
    // was lost: how much cannot be known.
    this._unknownLoss = false;
    this._closed = false;
    /** @type {ProcessState|null} */
    this.state = null;
    this.missedBytes = 0;
  }

  /** The position after the last chunk yielded. @returns {Cursor} */
  get cursor() {
    return { seq: this._seq, offset: this._offset };
  }

  /** The output is closed and every chunk has been yielded. */
  get done() {
    return this._closed && this._pending.length === 0;
  }

  [Symbol.asyncIterator]() {
    return this;
  }

  /** @returns {Promise<IteratorResult<OutputChunk>>} */
  async next() {
    for (;;) {
      while (this._pending.length) {
        const chunk = this._take();
        if (chunk) return { value: chunk, done: false };
      }
      if (this._closed) {
        this._accountTail();
        return { value: undefined, done: true };
      }
      const r = await this.process.read({ afterSeq: this._seq, waitMs: this.waitMs, maxBytes: this.maxBytes });
      this.state = r.state;
      if (this._offset === null && r.gap && r.chunks.length) {
        // The gap is before the first chunk unless it is one between two of them.
        const between = r.chunks.some((c, i) => i > 0 && c.offset !== r.chunks[i - 1].offset + r.chunks[i - 1].data.length);
        this._unknownLoss = !between;
      }
      this._pending.push(...r.chunks);
      if (r.state.closed && !r.more) this._closed = true;
    }
  }

  /** Leaving a `for await` loop early keeps the follower: iterate it again to go on. */
  async return() {
    return { value: undefined, done: true };
  }

  _take() {
    let chunk = this._pending.shift();
    // The cursor moves past a seq only once all of its pieces are out (a chunk cut by the
    // retention window comes as two pieces with one seq, in one read).
    if (!(this._pending.length && this._pending[0].seq === chunk.seq)) this._seq = chunk.seq;
    let missed = 0;
    if (this._offset === null) {
      missed = this._unknownLoss ? null : 0;
      this._unknownLoss = false;
    } else if (chunk.offset + chunk.data.length <= this._offset) {
      return null; // yielded before this cursor was taken
    } else if (chunk.offset < this._offset) {
      // Partly yielded before: only the rest.
      chunk = { seq: chunk.seq, offset: this._offset, data: chunk.data.subarray(this._offset - chunk.offset) };
    } else {
      missed = chunk.offset - this._offset;
      this.missedBytes += missed;
    }
    this._offset = chunk.offset + chunk.data.length;
    return { seq: chunk.seq, offset: chunk.offset, data: chunk.data, missed };
  }

  _accountTail() {
    // Output lost after the last chunk yielded with none of it retained (not expected: the
    // window always keeps the last bytes), counted from the final size all the same.
    if (this.state && this._offset !== null && this.state.outputBytes > this._offset) {
      this.missedBytes += this.state.outputBytes - this._offset;
      this._offset = this.state.outputBytes;
    }
  }
}
