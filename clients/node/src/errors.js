// Typed errors: a gRPC failure becomes a CorralError (or a subclass per status code) carrying the
// status code, message, metadata and the decoded google.rpc.Status details (BadRequest et al.).
import * as grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

// The google.rpc messages corral may attach (subset of google/rpc/status.proto and
// error_details.proto, same field numbers).
const RPC_PROTO = `
syntax = "proto3";
package google.rpc;
message Any { string type_url = 1; bytes value = 2; }
message Status { int32 code = 1; string message = 2; repeated Any details = 3; }
message ErrorInfo { string reason = 1; string domain = 2; map<string, string> metadata = 3; }
message BadRequest {
  message FieldViolation { string field = 1; string description = 2; string reason = 3; }
  repeated FieldViolation field_violations = 1;
}
message PreconditionFailure {
  message Violation { string type = 1; string subject = 2; string description = 3; }
  repeated Violation violations = 1;
}
message ResourceInfo {
  string resource_type = 1; string resource_name = 2; string owner = 3; string description = 4;
}
message QuotaFailure {
  message Violation { string subject = 1; string description = 2; }
  repeated Violation violations = 1;
}
message DebugInfo { repeated string stack_entries = 1; string detail = 2; }
message Help {
  message Link { string description = 1; string url = 2; }
  repeated Link links = 1;
}
message LocalizedMessage { string locale = 1; string message = 2; }
message RetryInfo { Duration retry_delay = 1; }
message Duration { int64 seconds = 1; int32 nanos = 2; }
`;

let rpcRoot;
function rpc() {
  rpcRoot ??= protobuf.parse(RPC_PROTO, { keepCase: false }).root;
  return rpcRoot;
}

const CONVERT = { longs: Number, enums: String, bytes: Buffer, defaults: true, arrays: true };

/**
 * Decodes a `grpc-status-details-bin` trailer (a serialized google.rpc.Status).
 * Unknown detail types are kept as `{ typeUrl, value }`.
 * @param {Buffer} bin
 * @returns {Array<{type: string, [k: string]: any}>}
 */
export function decodeStatusDetails(bin) {
  const root = rpc();
  const status = root.lookupType('google.rpc.Status').decode(bin);
  return status.details.map((any) => {
    const typeName = any.typeUrl.slice(any.typeUrl.lastIndexOf('/') + 1);
    const type = typeName.startsWith('google.rpc.') ? root.lookup(typeName) : null;
    if (type instanceof protobuf.Type && typeName !== 'google.rpc.Any') {
      return { type: typeName, ...type.toObject(type.decode(any.value), CONVERT) };
    }
    return { type: typeName, typeUrl: any.typeUrl, value: Buffer.from(any.value) };
  });
}

/** gRPC status code names by number. */
export const StatusName = Object.freeze(
  Object.fromEntries(Object.entries(grpc.status).map(([name, num]) => [num, name])),
);

/** An error from corral: a gRPC status with its decoded details. */
export class CorralError extends Error {
  /**
   * @param {string} message
   * @param {{code?: string, grpcCode?: number, details?: object[], metadata?: grpc.Metadata, cause?: unknown}} [info]
   */
  constructor(message, info = {}) {
    super(message, info.cause === undefined ? undefined : { cause: info.cause });
    this.name = new.target.name;
    /** Status code name, e.g. `NOT_FOUND`. */
    this.code = info.code ?? 'UNKNOWN';
    /** Numeric gRPC status code. */
    this.grpcCode = info.grpcCode ?? grpc.status.UNKNOWN;
    /** Decoded google.rpc.Status details, each `{type: 'google.rpc.BadRequest', ...fields}`. */
    this.details = info.details ?? [];
    /** Response trailers, if any. */
    this.metadata = info.metadata;
  }

  /** The google.rpc.BadRequest detail (`{fieldViolations: [{field, description}]}`), if any. */
  get badRequest() {
    return this.details.find((d) => d.type === 'google.rpc.BadRequest');
  }

  /** Field names that the BadRequest detail blames. */
  get fieldViolations() {
    return this.badRequest?.fieldViolations ?? [];
  }
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

const BY_CODE = {
  [grpc.status.INVALID_ARGUMENT]: InvalidArgumentError,
  [grpc.status.NOT_FOUND]: NotFoundError,
  [grpc.status.PERMISSION_DENIED]: PermissionDeniedError,
  [grpc.status.RESOURCE_EXHAUSTED]: ResourceExhaustedError,
  [grpc.status.FAILED_PRECONDITION]: FailedPreconditionError,
  [grpc.status.DEADLINE_EXCEEDED]: DeadlineExceededError,
  [grpc.status.UNAVAILABLE]: UnavailableError,
  [grpc.status.CANCELLED]: CancelledError,
  [grpc.status.INTERNAL]: InternalError,
  [grpc.status.UNIMPLEMENTED]: UnimplementedError,
  [grpc.status.ALREADY_EXISTS]: AlreadyExistsError,
  [grpc.status.ABORTED]: AbortedError,
  [grpc.status.OUT_OF_RANGE]: OutOfRangeError,
  [grpc.status.DATA_LOSS]: DataLossError,
  [grpc.status.UNAUTHENTICATED]: UnauthenticatedError,
  [grpc.status.UNKNOWN]: UnknownError,
};

/**
 * Turns a grpc-js ServiceError into the matching CorralError subclass (other errors pass through).
 * @param {any} err
 * @returns {Error}
 */
export function fromGrpcError(err) {
  if (err instanceof CorralError || typeof err?.code !== 'number') return err;
  let details = [];
  const bin = err.metadata?.get?.('grpc-status-details-bin')?.[0];
  if (bin) {
    try {
      details = decodeStatusDetails(Buffer.isBuffer(bin) ? bin : Buffer.from(bin));
    } catch {
      details = [];
    }
  }
  const Cls = BY_CODE[err.code] ?? CorralError;
  return new Cls(err.details ?? err.message, {
    code: StatusName[err.code] ?? 'UNKNOWN',
    grpcCode: err.code,
    details,
    metadata: err.metadata,
    cause: err,
  });
}
