// Internal plumbing shared by the client modules: unary calls with deadlines, abort signals and
// typed errors.
import * as grpc from '@grpc/grpc-js';
import { CorralError, fromGrpcError } from './errors.js';

/** grpc-js call options from `{deadlineMs}`. */
export function callOptions(opts) {
  const out = {};
  if (opts?.deadlineMs) out.deadline = new Date(Date.now() + opts.deadlineMs);
  return out;
}

/**
 * One unary call; rejects with a CorralError (a subclass per status code), passed through
 * `opts.explain(err)` (which may resolve to a more telling error) when given.
 */
export function unary(stub, method, request, opts = {}) {
  return new Promise((resolvePromise, reject) => {
    if (opts.signal?.aborted) {
      reject(new CorralError('call aborted', { code: 'CANCELLED', grpcCode: grpc.status.CANCELLED }));
      return;
    }
    const onAbort = () => call.cancel();
    const call = stub[method](request, new grpc.Metadata(), callOptions(opts), (err, res) => {
      opts.signal?.removeEventListener('abort', onAbort);
      if (!err) resolvePromise(res);
      else if (opts.explain) Promise.resolve(opts.explain(fromGrpcError(err))).then(reject, () => reject(fromGrpcError(err)));
      else reject(fromGrpcError(err));
    });
    opts.signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** The object without its undefined values (proto-loader would send them as defaults). */
export function dropUndefined(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined));
}
