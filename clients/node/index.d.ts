// Type declarations of @corral/client (hand-written; the runtime is the plain ESM JavaScript in
// src/). Checked against a typed usage file by test/types.test.js (tsc --noEmit, strict).
/// <reference types="node" />
import type { ChannelCredentials, Metadata } from '@grpc/grpc-js';

// -- common ----------------------------------------------------------------------------------

export type SandboxMode = 'read-only' | 'workspace-write' | 'danger-full-access';
export type ShellToolName = 'unified_exec' | 'shell_command' | 'shell' | 'none';
export type ApplyPatchToolName = 'freeform' | 'function' | 'none';
export type ToolFormat = 'responses' | 'chat' | 'chat_completions' | 'chat-completions';
export type EntryKind =
  | 'ENTRY_KIND_UNSPECIFIED'
  | 'ENTRY_KIND_FILE'
  | 'ENTRY_KIND_DIRECTORY'
  | 'ENTRY_KIND_SYMLINK'
  | 'ENTRY_KIND_OTHER';

/** Per-call options: a deadline (ms from now) and an AbortSignal that cancels the call. */
export interface CallOptions {
  deadlineMs?: number;
  signal?: AbortSignal;
}

/** The largest message either side of a call may carry (64 MiB). */
export const MAX_MESSAGE_BYTES: number;
/** The environment variable naming the daemon's socket. */
export const SOCKET_ENV: 'CORRAL_SOCKET';
/** The system daemon's socket. */
export const SYSTEM_SOCKET: string;
/** The sandbox mode of a session opened without one: `'read-only'`. */
export const DEFAULT_MODE: 'read-only';

/** The daemon to call when no address is given (the `corral` CLI's socket rule). */
export function defaultTarget(): string;
/** Throws PermissionDeniedError for a socket another user could have planted. */
export function checkSocket(path: string, uid?: number): void;
/** Maps corral's address forms to a grpc-js target. */
export function parseTarget(address: string): { target: string; unix: boolean };
/** The directory holding corral/v1/corral.proto. */
export function protoDir(): string;
/** The loaded corral.v1 package (grpc-js service constructors). */
export function corralPackage(): Record<string, any>;

// -- messages --------------------------------------------------------------------------------

export interface Capabilities {
  apiVersion: string;
  serverVersion: string;
  tools: string[];
  layers: { name: string; status: string; detail: string }[];
  landlockAbi: number;
  sessionIdleTimeoutSeconds: number;
  maxSessions: number;
  profiles: string[];
}

export interface CapturedOutput {
  head: Buffer;
  tail: Buffer;
  totalBytes: number;
  droppedBytes: number;
}

export interface ShellResult {
  exitCode: number;
  signal: number;
  durationSeconds: number;
  timedOut: boolean;
  truncated: boolean;
  sandboxDenied: boolean;
  stdout: CapturedOutput;
  stderr: CapturedOutput;
  combined: CapturedOutput;
  text: string;
  success: boolean;
  escalated: boolean;
  /** Set when the command waits for the user's decision (then nothing else is). */
  approval: ApprovalRequest | null;
}

export type ShellEvent =
  | { type: 'begin'; argv: string[]; cwd: string }
  | { type: 'delta'; seq: number; stream: 'stdout' | 'stderr' | 'unspecified'; data: Buffer }
  | { type: 'end'; result: ShellResult }
  /** The only event when the command waits for the user's decision (decideApproval runs it). */
  | { type: 'approval'; request: ApprovalRequest };

export interface ReadFileResult {
  path: string;
  lines: { number: number; text: string }[];
  text: string;
}

export interface ListDirResult {
  absolutePath: string;
  entries: { relativePath: string; name: string; depth: number; kind: EntryKind }[];
  moreEntries: boolean;
  text: string;
}

export interface GrepFilesResult {
  matches: { path: string; modifiedUnixSeconds: number; modifiedNanos: number }[];
  truncated: boolean;
  text: string;
}

export interface ApplyPatchResult {
  changes: {
    path: string;
    kind: 'FILE_CHANGE_KIND_ADDED' | 'FILE_CHANGE_KIND_MODIFIED' | 'FILE_CHANGE_KIND_DELETED' | 'FILE_CHANGE_KIND_MOVED';
    movedFrom: string;
    unifiedDiff: string;
    overwritten: boolean;
  }[];
  text: string;
  warnings: string[];
}

export type ContentItem =
  | { item: 'inputText'; inputText: string }
  | { item: 'inputImage'; inputImage: { imageUrl: string; detail: string } };

export interface InvokeResult {
  callId: string;
  output: string;
  success: boolean;
  /** Only when the output is content items (view_image's image). */
  contentItems?: ContentItem[];
  /** Only when the call waits for the user's decision (the session's approval policy). */
  approval?: ApprovalRequest;
  /** Only for a call that ran (or wrote to) a command: its exit code, or the process id it
   * still runs under. */
  command?: { exitCode?: number; processId?: number };
}

export type ApprovalPolicyName = 'untrusted' | 'on-failure' | 'on-request' | 'never';
/** How a session's commands reach the network (`SessionSettings.network`). */
export type NetworkModeName = 'off' | 'on' | 'proxy';
export type ApprovalDecisionName = 'approved' | 'approved_for_session' | 'denied';

/** A call that needs the user's decision: answer it with decideApproval. */
export interface ApprovalRequest {
  approvalId: string;
  /** The argv that would run. */
  command: string[];
  cwd: string;
  /** e.g. `command failed; retry without sandbox?` (may be empty). */
  reason: string;
  /** The model's justification, if any. */
  justification: string;
  kind: 'APPROVAL_KIND_BEFORE_RUN' | 'APPROVAL_KIND_RETRY_UNSANDBOXED' | 'APPROVAL_KIND_ESCALATE';
  expiresAtUnixMs: number;
  /** What the model gets if the request is denied or expires. */
  rejectedOutput: string;
  callId: string;
}

/** The completed call an approval stood for. */
export type DecidedCall =
  | { result: 'invoke'; invoke: InvokeResult }
  | { result: 'shell'; shell: ShellResult }
  | { result: 'startProcess'; startProcess: { processId: number; approval: ApprovalRequest | null } };

/** What a transfer moved. */
export interface TransferSummary {
  /** The destination (upload) or source (download), resolved on the daemon's side. */
  path: string;
  files: number;
  directories: number;
  symlinks: number;
  bytes: number;
  /** Relative paths of FIFOs, sockets and devices left out. */
  skipped: string[];
}

// -- client and sessions ---------------------------------------------------------------------

export interface TlsOptions {
  rootCerts?: Buffer;
  privateKey?: Buffer;
  certChain?: Buffer;
  serverName?: string;
}

export interface ClientOptions {
  /** TLS for a TCP address (`true`: the system roots). */
  tls?: boolean | TlsOptions;
  /** Overrides `tls`. */
  credentials?: ChannelCredentials;
  /**
   * A bearer token the daemon maps to a local user (its `[[tokens]]`), sent as
   * `authorization: Bearer TOKEN`. Default: `$CORRAL_TOKEN`. As for the `corral` CLI: TCP
   * addresses with TLS only (`$CORRAL_TOKEN` is ignored for a Unix socket; an explicit token there,
   * or any token over plain TCP, throws InvalidArgumentError).
   */
  token?: string;
  /** grpc-js channel options (message size limits default to MAX_MESSAGE_BYTES). */
  channelOptions?: Record<string, unknown>;
  /** The default deadline of unary calls. */
  deadlineMs?: number;
}

export interface SessionSettings {
  /** Default: process.cwd(). */
  cwd?: string;
  /** Default: `'read-only'`. */
  mode?: SandboxMode;
  writableRoots?: string[];
  networkAccess?: boolean;
  excludeTmpdirEnvVar?: boolean;
  excludeSlashTmp?: boolean;
  /**
   * Merged over the daemon's default environment (HOME, USER, LOGNAME, SHELL from the user's
   * passwd entry, a system PATH, LANG=C.UTF-8): an entry replaces that default, the others stay.
   */
  env?: Record<string, string>;
  profile?: string;
  shellTool?: ShellToolName;
  applyPatchTool?: ApplyPatchToolName;
  updatePlan?: boolean;
  viewImage?: boolean;
  noImageInput?: boolean;
  /** The longest an empty write_stdin poll waits (0: Codex's 300 000). */
  backgroundTerminalMaxTimeoutMs?: number;
  /** When command calls wait for the user's decision (unset: never asked). */
  approvalPolicy?: ApprovalPolicyName;
  /** How long a request waits for a decision (default ten minutes). */
  approvalTimeoutMs?: number;
  /**
   * How commands reach the network (unset: `networkAccess` decides). `'proxy'`: only the hosts
   * `allowDomains` names, through corral's egress proxy.
   */
  network?: NetworkModeName;
  /** `'proxy'`: the hosts commands may reach (`example.com`, `*.example.com`, `:PORT`, `:PORT,PORT`). */
  allowDomains?: string[];
  /** `'proxy'`: hosts refused even when an allow rule matches. */
  denyDomains?: string[];
}

/** A proxied session's new rules (Session.setNetworkRules, Client.setNetworkRules). */
export interface NetworkRules {
  allowDomains?: string[];
  denyDomains?: string[];
}

export interface ShellOptions extends CallOptions {
  workdir?: string;
  timeoutMs?: number;
  login?: boolean;
  withEscalatedPermissions?: boolean;
  justification?: string;
  truncation?: { bytes: number } | { tokens: number };
}

export interface InvokeCall extends CallOptions {
  sessionId: string;
  name: string;
  arguments?: string | object;
  callId?: string;
  freeform?: boolean;
}

/** A connection to a corral daemon. */
export class Client {
  constructor(address?: string, options?: ClientOptions);
  readonly target: string;
  defaultDeadlineMs: number | undefined;
  waitForReady(timeoutMs?: number): Promise<void>;
  /** grpc.health.v1 status of the daemon (or one of its services): `'SERVING'`, … */
  health(service?: string, opts?: CallOptions): Promise<'UNKNOWN' | 'SERVING' | 'NOT_SERVING' | 'SERVICE_UNKNOWN' | string>;
  capabilities(opts?: CallOptions): Promise<Capabilities>;
  openSession(settings?: SessionSettings, opts?: CallOptions): Promise<Session>;
  /** Replaces a `network: 'proxy'` session's allow and deny rules (new connections follow them). */
  setNetworkRules(call: { sessionId: string } & NetworkRules & CallOptions): Promise<void>;
  /** Attaches to a session opened earlier (nothing is sent; an unknown id fails on first use). */
  session(sessionId: string): Session;
  closeSession(sessionId: string, opts?: CallOptions): Promise<void>;
  listTools(format?: ToolFormat, opts?: { sessionId?: string; exclude?: string[] } & CallOptions): Promise<object[]>;
  invoke(call: InvokeCall): Promise<InvokeResult>;
  decideApproval(
    call: { sessionId: string; approvalId: string; decision: ApprovalDecisionName | boolean } & CallOptions,
  ): Promise<DecidedCall>;
  /** Whether the `untrusted` policy would run this argv without asking. */
  classifyCommand(command: string[], opts?: CallOptions): Promise<boolean>;
  close(): void;
  [Symbol.dispose](): void;
  [Symbol.asyncDispose](): Promise<void>;
}

/** An open session. */
export class Session {
  constructor(client: Client, id: string, info?: { writableRoots?: string[]; skippedWritableRoots?: string[] });
  readonly client: Client;
  readonly id: string;
  writableRoots: string[];
  skippedWritableRoots: string[];
  closed: boolean;
  readonly processes: Processes;
  readonly files: Files;
  readFile(
    filePath: string,
    opts?: {
      offset?: number;
      limit?: number;
      mode?: 'slice' | 'indentation';
      indentation?: { anchorLine?: number; maxLevels?: number; includeSiblings?: boolean; includeHeader?: boolean; maxLines?: number };
    } & CallOptions,
  ): Promise<ReadFileResult>;
  listDir(dirPath: string, opts?: { offset?: number; limit?: number; depth?: number } & CallOptions): Promise<ListDirResult>;
  grepFiles(pattern: string, opts?: { include?: string; path?: string; limit?: number } & CallOptions): Promise<GrepFilesResult>;
  applyPatch(patch: string, opts?: CallOptions): Promise<ApplyPatchResult>;
  /** An argv array runs execvp-style; a string runs in the user's shell. */
  shell(command: string[] | string, opts?: ShellOptions): Promise<ShellResult>;
  shellStream(command: string[] | string, opts?: ShellOptions): AsyncGenerator<ShellEvent, void, undefined>;
  listTools(format?: ToolFormat, opts?: { exclude?: string[] } & CallOptions): Promise<object[]>;
  invoke(name: string, args?: string | object, opts?: { callId?: string; freeform?: boolean } & CallOptions): Promise<InvokeResult>;
  decideApproval(approvalId: string, decision: ApprovalDecisionName | boolean, opts?: CallOptions): Promise<DecidedCall>;
  /** Replaces this `network: 'proxy'` session's allow and deny rules. */
  setNetworkRules(rules?: NetworkRules & CallOptions): Promise<void>;
  close(opts?: CallOptions): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;
}

// -- processes -------------------------------------------------------------------------------

export interface ProcessState {
  running: boolean;
  exitCode: number | null;
  closed: boolean;
  outputBytes: number;
}

export interface OutputChunk {
  seq: number;
  offset: number;
  data: Buffer;
  /** follow() only: bytes lost right before this chunk (null: some, count unknown). */
  missed?: number | null;
}

export interface ReadResult {
  chunks: OutputChunk[];
  gap: boolean;
  more: boolean;
  lastSeq: number | null;
  state: ProcessState;
}

/** Where a reader is in a process's output; plain JSON. */
export interface Cursor {
  seq: number | null;
  offset: number | null;
}

export interface ProcessInfo {
  id: number;
  command: string[];
  tty: boolean;
  state: ProcessState;
  escalated: boolean;
}

export type StartOptions = (
  | { argv: string[]; script?: undefined }
  | { script: string; argv?: undefined }
) & {
  workdir?: string;
  tty?: boolean;
  rows?: number;
  cols?: number;
  env?: Record<string, string>;
  escalated?: boolean;
} & CallOptions;

export interface FollowOptions {
  afterSeq?: number | Cursor | null;
  waitMs?: number;
  maxBytes?: number;
}

export class Processes {
  constructor(session: Session);
  readonly session: Session;
  start(options: StartOptions): Promise<Process>;
  attach(processId: number): Process;
  list(opts?: CallOptions): Promise<ProcessInfo[]>;
}

export class Process {
  constructor(session: Session, id: number, info?: { tty?: boolean });
  readonly session: Session;
  readonly id: number;
  readonly tty: boolean | undefined;
  write(data: Buffer | Uint8Array | string, opts?: { closeStdin?: boolean } & CallOptions): Promise<void>;
  closeStdin(opts?: CallOptions): Promise<void>;
  read(opts?: FollowOptions & CallOptions): Promise<ReadResult>;
  follow(opts?: FollowOptions): Follower;
  wait(opts?: { timeoutMs?: number }): Promise<ProcessState>;
  resize(rows: number, cols: number, opts?: CallOptions): Promise<void>;
  signal(sig: string | number, opts?: CallOptions): Promise<void>;
  terminate(opts?: CallOptions): Promise<ProcessState>;
  [Symbol.asyncDispose](): Promise<void>;
}

/** Iterates a process's output until it closes (`for await`); resumable from `cursor`. */
export class Follower implements AsyncIterableIterator<OutputChunk> {
  constructor(process: Process, opts?: FollowOptions);
  readonly process: Process;
  readonly cursor: Cursor;
  readonly done: boolean;
  state: ProcessState | null;
  missedBytes: number;
  next(): Promise<IteratorResult<OutputChunk>>;
  return(): Promise<IteratorResult<OutputChunk>>;
  [Symbol.asyncIterator](): Follower;
}

// -- files -----------------------------------------------------------------------------------

export type EntryKindName = 'ENTRY_KIND_FILE' | 'ENTRY_KIND_DIRECTORY' | 'ENTRY_KIND_SYMLINK' | 'ENTRY_KIND_OTHER';
export interface FileStat {
  path: string;
  kind: EntryKindName;
  size: number;
  /** Permission bits. */
  mode: number;
  modifiedMs: number;
  /** 0 when the filesystem records no birth time. */
  createdMs: number;
}
export interface DirectoryEntry {
  name: string;
  kind: EntryKindName;
}

export class Files {
  constructor(session: Session);
  readonly session: Session;
  /** The whole file (at most 3 MiB). */
  read(path: string, opts?: CallOptions): Promise<Buffer>;
  /** Writes the whole file atomically (at most 3 MiB). */
  write(
    path: string,
    data: Buffer | Uint8Array | string,
    opts?: { mode?: number; createParents?: boolean; overwrite?: boolean } & CallOptions,
  ): Promise<{ path: string; size: number }>;
  /** What is at `path` (a missing path: NotFoundError). */
  stat(path: string, opts?: { followSymlinks?: boolean } & CallOptions): Promise<FileStat>;
  /** The directory's entries, sorted by name. */
  listDirectory(path: string, opts?: CallOptions): Promise<DirectoryEntry[]>;
  /** Creates a directory (0755); `recursive`: `mkdir -p`. */
  makeDirectory(path: string, opts?: { recursive?: boolean } & CallOptions): Promise<string>;
  /** `rm [-r] [-f]`; a symlink is removed itself. */
  remove(path: string, opts?: { recursive?: boolean; force?: boolean } & CallOptions): Promise<string>;
  /** Copies within the session to exactly `destination` (a directory needs `recursive`). */
  copy(source: string, destination: string, opts?: { recursive?: boolean } & CallOptions): Promise<string>;
  /** Copies a local file, symlink or tree into the session (cp's rule into a directory). */
  upload(localPath: string, remotePath: string, opts?: { overwrite?: boolean; createParents?: boolean } & CallOptions): Promise<TransferSummary>;
  /** Copies a file, symlink or tree of the session to the local disk (atomically). */
  download(remotePath: string, localPath: string, opts?: { overwrite?: boolean } & CallOptions): Promise<TransferSummary>;
}

/** A local file changed while it was being uploaded: the upload was cancelled. */
export class TransferChangedError extends Error {}

// -- adapters --------------------------------------------------------------------------------

export interface FunctionCall {
  type: 'function_call';
  name: string;
  arguments: string;
  call_id: string;
}
export interface CustomToolCall {
  type: 'custom_tool_call';
  name: string;
  input: string;
  call_id: string;
}
export type ResponsesInputContent = { type: 'input_text'; text: string } | { type: 'input_image'; image_url: string; detail?: string };
export interface FunctionCallOutput {
  type: 'function_call_output';
  call_id: string;
  output: string | ResponsesInputContent[];
}
export interface CustomToolCallOutput {
  type: 'custom_tool_call_output';
  call_id: string;
  output: string;
}
export type ChatToolCall =
  | { id: string; type: 'function'; function: { name: string; arguments: string } }
  | { id: string; type: 'custom'; custom: { name: string; input: string } };
export interface ChatToolMessage {
  role: 'tool';
  tool_call_id: string;
  content: string | ({ type: 'text'; text: string } | { type: 'image_url'; image_url: { url: string } })[];
}

export interface AdapterOptions {
  exclude?: string[];
  onResult?: (call: object, result: InvokeResult) => void;
  /** Decides the session's approval requests (default: deny). */
  onApproval?: (request: ApprovalRequest) => ApprovalDecisionName | boolean | Promise<ApprovalDecisionName | boolean>;
}

/** The default onApproval: every request is denied. */
export function denyAll(): 'denied';

export class ResponsesAdapter {
  constructor(session: Session, options?: AdapterOptions);
  readonly session: Session;
  tools(): Promise<object[]>;
  static isToolCall(item: unknown): item is FunctionCall | CustomToolCall;
  handle(item: FunctionCall): Promise<FunctionCallOutput>;
  handle(item: CustomToolCall): Promise<CustomToolCallOutput>;
  handle(item: { type: string }): Promise<FunctionCallOutput | CustomToolCallOutput | null>;
  handleAll(items: { type: string }[]): Promise<(FunctionCallOutput | CustomToolCallOutput)[]>;
}

export class ChatCompletionsAdapter {
  constructor(session: Session, options?: AdapterOptions);
  readonly session: Session;
  tools(): Promise<object[]>;
  handle(toolCall: ChatToolCall): Promise<ChatToolMessage>;
  handleMessage(message: { tool_calls?: ChatToolCall[] | null }): Promise<ChatToolMessage[]>;
}

// -- errors ----------------------------------------------------------------------------------

export type StatusCodeName =
  | 'OK'
  | 'CANCELLED'
  | 'UNKNOWN'
  | 'INVALID_ARGUMENT'
  | 'DEADLINE_EXCEEDED'
  | 'NOT_FOUND'
  | 'ALREADY_EXISTS'
  | 'PERMISSION_DENIED'
  | 'RESOURCE_EXHAUSTED'
  | 'FAILED_PRECONDITION'
  | 'ABORTED'
  | 'OUT_OF_RANGE'
  | 'UNIMPLEMENTED'
  | 'INTERNAL'
  | 'UNAVAILABLE'
  | 'DATA_LOSS'
  | 'UNAUTHENTICATED';

export interface StatusDetail {
  /** e.g. `'google.rpc.BadRequest'`. */
  type: string;
  [field: string]: unknown;
}

/** A failed corral RPC: the gRPC status with its decoded google.rpc details. */
export class CorralError extends Error {
  constructor(
    message: string,
    info?: { code?: StatusCodeName; grpcCode?: number; details?: StatusDetail[]; metadata?: Metadata; cause?: unknown },
  );
  code: StatusCodeName;
  grpcCode: number;
  details: StatusDetail[];
  metadata: Metadata | undefined;
  readonly badRequest: (StatusDetail & { fieldViolations: { field: string; description: string; reason: string }[] }) | undefined;
  readonly fieldViolations: { field: string; description: string; reason: string }[];
}
export class InvalidArgumentError extends CorralError {}
export class NotFoundError extends CorralError {}
export class PermissionDeniedError extends CorralError {}
export class ResourceExhaustedError extends CorralError {}
export class FailedPreconditionError extends CorralError {}
export class DeadlineExceededError extends CorralError {}
export class UnavailableError extends CorralError {}
export class CancelledError extends CorralError {}
export class InternalError extends CorralError {}
export class UnimplementedError extends CorralError {}
export class AlreadyExistsError extends CorralError {}
export class AbortedError extends CorralError {}
export class OutOfRangeError extends CorralError {}
export class DataLossError extends CorralError {}
export class UnauthenticatedError extends CorralError {}
export class UnknownError extends CorralError {}

/** gRPC status code names by number. */
export const StatusName: Readonly<Record<number, StatusCodeName>>;
/** Decodes a `grpc-status-details-bin` trailer. */
export function decodeStatusDetails(bin: Buffer): StatusDetail[];
/** A grpc-js error as the matching CorralError subclass (other errors pass through). */
export function fromGrpcError(err: unknown): Error;
