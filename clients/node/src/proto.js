// Loads corral's protos with @grpc/proto-loader. The protos come from, in order: $CORRAL_PROTO_DIR,
// the repository's proto/ directory when the package sits in a corral checkout (clients/node, also
// through the symlink `npm install ./clients/node` makes), or the package's own copy (proto/,
// checked in and kept the same by scripts/copy-protos.mjs), which every installed copy carries.
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as grpc from '@grpc/grpc-js';
import * as protoLoader from '@grpc/proto-loader';

const PACKAGE_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const MAIN_PROTO = join('corral', 'v1', 'corral.proto');

/** Options shared by every load: camelCase fields, enums as names, 64-bit integers as Numbers. */
export const LOADER_OPTIONS = Object.freeze({
  keepCase: false,
  longs: Number,
  enums: String,
  bytes: Buffer,
  defaults: true,
  oneofs: true,
});

/**
 * The directory holding `corral/v1/corral.proto`.
 * @returns {string}
 */
export function protoDir() {
  const checkout = join(PACKAGE_ROOT, '..', '..');
  const candidates = [
    process.env.CORRAL_PROTO_DIR,
    existsSync(join(checkout, 'Cargo.toml')) ? join(checkout, 'proto') : undefined,
    join(PACKAGE_ROOT, 'proto'),
  ].filter(Boolean);
  for (const dir of candidates) {
    if (existsSync(join(dir, MAIN_PROTO))) return dir;
  }
  throw new Error(
    `corral protos not found (looked for ${MAIN_PROTO} in ${candidates.join(', ')}); ` +
      'set CORRAL_PROTO_DIR to the directory holding corral/v1/corral.proto',
  );
}

let cached;

/**
 * The loaded `corral.v1` package: service constructors (Sessions, Tools, Bridge, Processes).
 * @returns {{Sessions: typeof grpc.Client, Tools: typeof grpc.Client, Bridge: typeof grpc.Client,
 *   Processes: typeof grpc.Client}}
 */
export function corralPackage() {
  if (!cached) {
    const dir = protoDir();
    const definition = protoLoader.loadSync(MAIN_PROTO, { ...LOADER_OPTIONS, includeDirs: [dir] });
    cached = grpc.loadPackageDefinition(definition).corral.v1;
  }
  return cached;
}
