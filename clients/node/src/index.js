// @corral/client: a thin Node.js client for corral.
export { Client, Session, DEFAULT_MODE, MAX_MESSAGE_BYTES, SOCKET_ENV, SYSTEM_SOCKET, checkSocket, defaultTarget, parseTarget } from './client.js';
export { Files, TransferChangedError } from './files.js';
export { Processes, Process, Follower } from './processes.js';
export { ResponsesAdapter, ChatCompletionsAdapter, denyAll } from './adapters.js';
export {
  CorralError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  ResourceExhaustedError,
  FailedPreconditionError,
  DeadlineExceededError,
  UnavailableError,
  CancelledError,
  InternalError,
  UnimplementedError,
  AlreadyExistsError,
  AbortedError,
  OutOfRangeError,
  DataLossError,
  UnauthenticatedError,
  UnknownError,
  StatusName,
  decodeStatusDetails,
  fromGrpcError,
} from './errors.js';
export { protoDir, corralPackage } from './proto.js';
