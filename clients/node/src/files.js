// Byte-exact file transfer into and out of a session: the corral.v1.Files service.
//
// `session.files.read(path)` and `write(path, data)` move one small file (at most 3 MiB) as bytes;
// `upload(local, remote)` and `download(remote, local)` move a file or a whole directory tree of
// any size, with permission bits, symlinks as symlinks (never followed). The daemon reads and
// writes only what the session's commands could, and its writes are atomic; so are this side's: a
// download appears complete under its name, or not at all.
//
// When the destination is an existing directory, the copy lands inside it under the source's
// name (cp's rule); otherwise the destination is the copy. An existing copy is replaced only with
// `overwrite: true` (a file by a file, a directory by a directory). The same rules as the Python
// client's corral_client.files.
import { constants as fsc } from 'node:fs';
import * as fs from 'node:fs/promises';
import { basename, dirname, join, posix, resolve } from 'node:path';
import * as grpc from '@grpc/grpc-js';
import { fromGrpcError } from './errors.js';
import { callOptions, dropUndefined, unary } from './rpc.js';

/** The largest data message of a transfer (UploadRequest.data: "chunks of at most 1 MiB"). */
export const CHUNK_BYTES = 1024 * 1024;
const FILE = 'ENTRY_KIND_FILE';
const DIR = 'ENTRY_KIND_DIRECTORY';
const LINK = 'ENTRY_KIND_SYMLINK';

/**
 * @typedef {import('./client.js').Session} Session
 * @typedef {{deadlineMs?: number, signal?: AbortSignal}} CallOptions
 * @typedef {{path: string, files: number, directories: number, symlinks: number, bytes: number, skipped: string[]}} TransferSummary
 */

/**
 * A local file changed (grew, shrank or was replaced) while it was being uploaded: the upload was
 * cancelled, and the daemon changed nothing.
 */
export class TransferChangedError extends Error {
  constructor(message) {
    super(message);
    this.name = 'TransferChangedError';
  }
}

function checkUtf8(name, path) {
  // A name that is not valid UTF-8 comes back from Node with U+FFFD in it: it could not be sent.
  if (name.includes('\uFFFD')) throw new TypeError(`${path}: corral transfers UTF-8 names only`);
  return name;
}

/**
 * The tree under `localPath`, parents before children (nothing followed), and the relative paths
 * of what cannot be sent (FIFOs, sockets, devices). Walked before the call starts, so an
 * unreadable directory fails here and not half-way through the stream.
 * @param {string} localPath
 */
export async function planUpload(localPath) {
  const nodes = [];
  const skipped = [];
  const visit = async (rel, path) => {
    const st = await fs.lstat(path, { bigint: false });
    if (st.isSymbolicLink()) nodes.push({ rel, path, st, linkTarget: checkUtf8(await fs.readlink(path), path) });
    else if (st.isFile()) nodes.push({ rel, path, st });
    else if (st.isDirectory()) {
      nodes.push({ rel, path, st });
      // Byte order of the UTF-8 names, as the Python client sends them.
      const names = (await fs.readdir(path)).sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
      for (const name of names) await visit(rel ? `${rel}/${checkUtf8(name, path)}` : checkUtf8(name, path), join(path, name));
    } else if (rel) skipped.push(rel);
    else throw new TypeError(`${localPath} is not a file, a directory or a symlink`);
  };
  await visit('', localPath);
  return { nodes, skipped };
}

/**
 * The Upload stream: the start, then each node's entry, a file's entry followed by exactly its
 * bytes, then the finish that commits it. A file that changed since planUpload throws TransferChangedError (the caller cancels
 * the call: the daemon commits only a complete stream).
 */
export async function* uploadRequests(sessionId, localPath, remotePath, nodes, { overwrite = false, createParents = false } = {}) {
  const name = basename(resolve(localPath));
  yield { start: { sessionId, path: remotePath, sourceName: name, overwrite, createParents } };
  for (const node of nodes) {
    const mode = node.st.mode & 0o777;
    if (node.st.isSymbolicLink()) yield { entry: { path: node.rel, kind: LINK, linkTarget: node.linkTarget } };
    else if (node.st.isDirectory()) yield { entry: { path: node.rel, kind: DIR, mode } };
    else {
      yield { entry: { path: node.rel, kind: FILE, mode, size: node.st.size } };
      yield* fileData(node);
    }
  }
  // Only a stream that reaches its finish is committed (each file sent exactly its size, or
  // TransferChangedError was thrown above): a cancelled call can look like an ended one.
  const bytes = nodes.reduce((sum, n) => (n.st.isFile() ? sum + n.st.size : sum), 0);
  yield { finish: { entries: nodes.length, bytes } };
}

async function* fileData(node) {
  // O_NOFOLLOW and the inode check: the file read is the one walked, not a symlink or another file
  // swapped in since.
  const fh = await fs.open(node.path, fsc.O_RDONLY | fsc.O_NOFOLLOW);
  try {
    const st = await fh.stat();
    if (st.dev !== node.st.dev || st.ino !== node.st.ino) {
      throw new TransferChangedError(`${node.path} was replaced while it was being uploaded`);
    }
    let left = node.st.size;
    while (left > 0) {
      const buf = Buffer.allocUnsafe(Math.min(left, CHUNK_BYTES));
      const { bytesRead } = await fh.read(buf, 0, buf.length, null);
      if (bytesRead === 0) throw new TransferChangedError(`${node.path} shrank while it was being uploaded`);
      left -= bytesRead;
      yield { data: buf.subarray(0, bytesRead) };
    }
    const { bytesRead } = await fh.read(Buffer.alloc(1), 0, 1, null);
    if (bytesRead) throw new TransferChangedError(`${node.path} grew while it was being uploaded`);
  } finally {
    await fh.close();
  }
}

/** Where a download lands: inside `localPath` when it is a directory (cp's rule), else itself. */
export async function downloadDestination(remotePath, localPath) {
  const local = resolve(localPath);
  const name = posix.basename(posix.normalize(remotePath));
  const isDir = await fs.stat(local).then((s) => s.isDirectory(), () => false);
  return isDir && !['', '.', '..', '/'].includes(name) ? join(local, name) : local;
}

async function lexists(path) {
  return fs.lstat(path).then(() => true, () => false);
}

/**
 * Writes a Download stream to the local disk: everything goes into a private staging directory
 * beside the destination, and the finished tree is renamed into place; on any error the staging
 * directory is removed and the destination is untouched. The stream is checked as it comes:
 * entry paths are relative with normal components only, every parent is a directory made by this
 * download (so nothing is written through a symlink the stream created), each file gets exactly
 * the bytes its entry announced.
 */
export class DownloadSink {
  static async open(remotePath, localPath, { overwrite = false } = {}) {
    const dest = await downloadDestination(remotePath, localPath);
    if (!overwrite && (await lexists(dest))) {
      throw Object.assign(new Error(`${dest} exists (pass overwrite: true to replace it)`), { code: 'EEXIST' });
    }
    const stage = await fs.mkdtemp(join(dirname(dest), `.${basename(dest)}.`));
    return new DownloadSink(dest, stage, overwrite);
  }

  constructor(dest, stage, overwrite) {
    this.dest = dest;
    this.overwrite = overwrite;
    this._stage = stage;
    this._root = join(stage, 'root');
    this._rootKind = null;
    /** rel -> mode, applied once the tree is complete. */
    this._dirs = new Map();
    this._file = null;
    this._left = 0;
    this._filePath = '';
    /** @type {TransferSummary|null} */
    this.summary = null;
  }

  /** Takes one message of the stream. */
  async feed(msg) {
    if (this.summary) throw new TypeError('the download stream went on after its summary');
    if (msg.item === 'data') {
      if (!this._file || msg.data.length > this._left) {
        throw new TypeError(`the download stream sent more bytes than announced for ${this._filePath || 'no file'}`);
      }
      await this._file.write(msg.data);
      this._left -= msg.data.length;
      return;
    }
    await this._finishFile();
    if (msg.item === 'entry') await this._entry(msg.entry);
    else if (msg.item === 'summary') {
      if (this._rootKind === null) throw new TypeError('the download stream ended without any entry');
      this.summary = msg.summary;
    } else throw new TypeError('the download stream sent an empty message');
  }

  _path(rel) {
    if (this._rootKind === null) {
      if (rel !== '') throw new TypeError(`the download stream's first entry is ${JSON.stringify(rel)}, not the root`);
      return this._root;
    }
    const parts = rel.split('/');
    if (rel === '' || parts.some((p) => p === '' || p === '.' || p === '..' || p.includes('\0'))) {
      throw new TypeError(`the download stream sent an invalid path ${JSON.stringify(rel)}`);
    }
    if (!this._dirs.has(parts.slice(0, -1).join('/'))) {
      throw new TypeError(`the download stream sent ${JSON.stringify(rel)} before its directory`);
    }
    return join(this._root, ...parts);
  }

  async _entry(e) {
    const path = this._path(e.path);
    if (this._rootKind === null) this._rootKind = e.kind;
    const mode = e.mode === undefined ? undefined : e.mode & 0o777;
    if (e.kind === DIR) {
      await fs.mkdir(path, { mode: 0o700 }); // writable by us until the tree is complete
      this._dirs.set(e.path, mode ?? 0o755);
    } else if (e.kind === FILE) {
      this._file = await fs.open(path, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
      this._left = e.size;
      this._filePath = e.path || this.dest;
      await this._file.chmod(mode ?? 0o644);
    } else if (e.kind === LINK) {
      await fs.symlink(e.linkTarget, path);
    } else {
      throw new TypeError(`the download stream sent an entry of kind ${e.kind} for ${JSON.stringify(e.path)}`);
    }
  }

  async _finishFile() {
    if (!this._file) return;
    const f = this._file;
    this._file = null;
    await f.close();
    if (this._left) throw new TypeError(`the download stream sent ${this._left} bytes less than announced for ${this._filePath}`);
  }

  /** Puts the finished tree in place (replacing the destination if allowed). @returns {Promise<TransferSummary>} */
  async commit() {
    if (!this.summary) throw new TypeError('the download stream ended without its summary');
    const depth = (rel) => (rel === '' ? -1 : rel.split('/').length);
    for (const rel of [...this._dirs.keys()].sort((a, b) => depth(b) - depth(a))) {
      await fs.chmod(rel ? join(this._root, ...rel.split('/')) : this._root, this._dirs.get(rel));
    }
    const old = await fs.lstat(this.dest).catch(() => null);
    if (!old) await fs.rename(this._root, this.dest);
    else if (!this.overwrite) {
      throw Object.assign(new Error(`${this.dest} appeared during the download`), { code: 'EEXIST' });
    } else if (old.isDirectory() !== (this._rootKind === DIR)) {
      const what = old.isDirectory() ? 'a directory' : 'not a directory';
      throw Object.assign(new Error(`${this.dest} is ${what}; a download replaces only its own kind`), {
        code: old.isDirectory() ? 'EISDIR' : 'ENOTDIR',
      });
    } else if (old.isDirectory()) {
      // rename(2) does not replace a non-empty directory: the old tree steps aside first.
      await fs.rename(this.dest, join(this._stage, 'old'));
      await fs.rename(this._root, this.dest);
    } else {
      await fs.rename(this._root, this.dest);
    }
    await this.close();
    return this.summary;
  }

  /** Removes the staging directory (after a commit, or instead of one). */
  async close() {
    if (this._file) {
      await this._file.close().catch(() => {});
      this._file = null;
    }
    // Directories made read-only by the stream's modes must be writable to be removed.
    const unlock = async (dir) => {
      for (const d of await fs.readdir(dir, { withFileTypes: true }).catch(() => [])) {
        if (d.isDirectory()) {
          const p = join(dir, d.name);
          await fs.chmod(p, 0o700).catch(() => {});
          await unlock(p);
        }
      }
    };
    await unlock(this._stage);
    await fs.rm(this._stage, { recursive: true, force: true });
  }
}

function summaryOf(s = {}) {
  return {
    path: s.path ?? '',
    files: s.files ?? 0,
    directories: s.directories ?? 0,
    symlinks: s.symlinks ?? 0,
    bytes: s.bytes ?? 0,
    skipped: [...(s.skipped ?? [])],
  };
}

/** One client-streaming call fed from an async iterator, with backpressure. */
function streamUnary(stub, method, requests, opts) {
  return new Promise((resolvePromise, reject) => {
    let failure = null;
    let finished = false;
    let onFinished;
    const finishedPromise = new Promise((r) => (onFinished = r));
    const call = stub[method](new grpc.Metadata(), callOptions(opts), (err, res) => {
      finished = true;
      onFinished();
      opts.signal?.removeEventListener('abort', onAbort);
      if (failure) reject(failure); // the call was cancelled because of it
      else if (err) reject(fromGrpcError(err));
      else resolvePromise(res);
    });
    const onAbort = () => call.cancel();
    opts.signal?.addEventListener('abort', onAbort, { once: true });
    (async () => {
      try {
        // Stops (closing the file being read) as soon as the call is over, e.g. refused early.
        for await (const msg of requests) {
          if (finished) break;
          if (!call.write(msg)) await Promise.race([new Promise((r) => call.once('drain', r)), finishedPromise]);
        }
        if (!finished) call.end();
      } catch (err) {
        // Cancel, never end: an ended stream could look complete to the daemon.
        failure = err;
        call.cancel();
      }
    })();
  });
}

/** `session.files`: byte-exact reads, writes, uploads and downloads in the session. */
export class Files {
  /** @param {Session} session */
  constructor(session) {
    this.session = session;
  }

  /**
   * The whole file (at most 3 MiB; larger: download()), as bytes.
   * @param {string} path
   * @param {CallOptions} [opts]
   * @returns {Promise<Buffer>}
   */
  async read(path, opts) {
    const client = this.session.client;
    const res = await unary(client._files, 'readBytes', { sessionId: this.session.id, path }, client._opts(opts));
    return res.data;
  }

  /**
   * Writes `data` as the whole file, atomically (at most 3 MiB; larger: upload()). `mode`:
   * permission bits (at most 0o777; default: the replaced file's, else 0o644); `createParents`:
   * make missing directories; `overwrite: false`: AlreadyExistsError if the path exists.
   * @param {string} path
   * @param {Buffer | Uint8Array | string} data a string is written as UTF-8
   * @param {{mode?: number, createParents?: boolean, overwrite?: boolean} & CallOptions} [opts]
   * @returns {Promise<{path: string, size: number}>}
   */
  async write(path, data, opts = {}) {
    const { mode, createParents = false, overwrite = true, ...call } = opts;
    const client = this.session.client;
    const req = dropUndefined({ sessionId: this.session.id, path, data: Buffer.from(data), mode, createParents, noOverwrite: !overwrite });
    const res = await unary(client._files, 'writeBytes', req, client._opts(call));
    return { path: res.path, size: res.size };
  }

  /**
   * What is at `path`: `{path, kind, size, mode, modifiedMs, createdMs}` (`kind`: an
   * `ENTRY_KIND_*` name; a final symlink is described itself unless `followSymlinks`). A missing
   * path rejects with NotFoundError.
   * @param {string} path
   * @param {{followSymlinks?: boolean} & CallOptions} [opts]
   */
  async stat(path, opts = {}) {
    const { followSymlinks = false, ...call } = opts;
    const client = this.session.client;
    const res = await unary(client._files, 'stat', { sessionId: this.session.id, path, followSymlinks }, client._opts(call));
    return { path: res.path, kind: res.kind, size: res.size, mode: res.mode, modifiedMs: res.modifiedMs, createdMs: res.createdMs };
  }

  /**
   * The directory's entries `{name, kind}`, sorted by name, without `.` and `..`.
   * @param {string} path
   * @param {CallOptions} [opts]
   * @returns {Promise<{name: string, kind: string}[]>}
   */
  async listDirectory(path, opts) {
    const client = this.session.client;
    const res = await unary(client._files, 'listDirectory', { sessionId: this.session.id, path }, client._opts(opts));
    return res.entries.map((e) => ({ name: e.name, kind: e.kind }));
  }

  /**
   * Creates a directory (0755); `recursive`: `mkdir -p`. Resolves to its resolved path.
   * @param {string} path
   * @param {{recursive?: boolean} & CallOptions} [opts]
   * @returns {Promise<string>}
   */
  async makeDirectory(path, opts = {}) {
    const { recursive = false, ...call } = opts;
    const client = this.session.client;
    const res = await unary(client._files, 'makeDirectory', { sessionId: this.session.id, path, recursive }, client._opts(call));
    return res.path;
  }

  /**
   * `rm [-r] [-f]`: a symlink is removed itself, never followed. Resolves to the resolved path.
   * @param {string} path
   * @param {{recursive?: boolean, force?: boolean} & CallOptions} [opts]
   * @returns {Promise<string>}
   */
  async remove(path, opts = {}) {
    const { recursive = false, force = false, ...call } = opts;
    const client = this.session.client;
    const res = await unary(client._files, 'remove', { sessionId: this.session.id, path, recursive, force }, client._opts(call));
    return res.path;
  }

  /**
   * Copies within the session to exactly `destination` (symlinks as symlinks; a directory needs
   * `recursive` and a new destination). Resolves to the destination's resolved path.
   * @param {string} source
   * @param {string} destination
   * @param {{recursive?: boolean} & CallOptions} [opts]
   * @returns {Promise<string>}
   */
  async copy(source, destination, opts = {}) {
    const { recursive = false, ...call } = opts;
    const client = this.session.client;
    const req = { sessionId: this.session.id, sourcePath: source, destinationPath: destination, recursive };
    const res = await unary(client._files, 'copy', req, client._opts(call));
    return res.path;
  }

  /**
   * Copies a local file, symlink or directory tree into the session (see the rules above).
   * FIFOs, sockets and devices are skipped and named in the summary's `skipped`. `deadlineMs`:
   * the whole transfer's deadline (default: none).
   * @param {string} localPath
   * @param {string} remotePath
   * @param {{overwrite?: boolean, createParents?: boolean} & CallOptions} [opts]
   * @returns {Promise<TransferSummary>}
   */
  async upload(localPath, remotePath, opts = {}) {
    const { overwrite = false, createParents = false, ...call } = opts;
    const { nodes, skipped } = await planUpload(localPath);
    const requests = uploadRequests(this.session.id, localPath, remotePath, nodes, { overwrite, createParents });
    const res = await streamUnary(this.session.client._files, 'upload', requests, call);
    const summary = summaryOf(res.summary);
    summary.skipped.push(...skipped);
    return summary;
  }

  /**
   * Copies a file, symlink or directory tree of the session to `localPath` (see the rules
   * above). Resolves to the summary (`skipped`: FIFOs, sockets and devices left out).
   * `deadlineMs`: the whole transfer's deadline (default: none).
   * @param {string} remotePath
   * @param {string} localPath
   * @param {{overwrite?: boolean} & CallOptions} [opts]
   * @returns {Promise<TransferSummary>}
   */
  async download(remotePath, localPath, opts = {}) {
    const { overwrite = false, ...call } = opts;
    const sink = await DownloadSink.open(remotePath, localPath, { overwrite });
    const stream = this.session.client._files.download({ sessionId: this.session.id, path: remotePath }, new grpc.Metadata(), callOptions(call));
    const onAbort = () => stream.cancel();
    call.signal?.addEventListener('abort', onAbort, { once: true });
    try {
      try {
        for await (const msg of stream) await sink.feed(msg);
      } catch (err) {
        throw fromGrpcError(err); // local errors pass through as they are
      }
      return summaryOf(await sink.commit());
    } finally {
      call.signal?.removeEventListener('abort', onAbort);
      stream.cancel();
      await sink.close();
    }
  }
}
