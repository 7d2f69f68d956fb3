// The package carries its own copy of the public proto (proto/corral/v1/corral.proto, checked in),
// so that any copy of it — `npm install --install-links ./clients/node`, a tarball from `npm pack`,
// install scripts on or off — finds its protos without the repository beside it. In a checkout
// src/proto.js reads the repository's ../../proto first. This script, the package's `prepare`,
// keeps the copy the same as ../../proto (worker.proto is internal: left out): npm runs it on
// `npm ci`/`npm install` here, before `npm pack`, and in the checkout before it links or packs it
// for another project. A change to proto/ therefore shows up as a change to the copy, to commit.
//
//   node scripts/copy-protos.mjs          copy ../../proto into proto/ where it differs
//   node scripts/copy-protos.mjs --check  exit 1, saying so, if the copy differs
import { copyFileSync, existsSync, mkdirSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const FILES = [join('corral', 'v1', 'corral.proto')];
const pkg = join(dirname(fileURLToPath(import.meta.url)), '..');
export const SOURCE = join(pkg, '..', '..', 'proto');
export const TARGET = join(pkg, 'proto');

/** The files whose copy differs from the repository's (none outside a checkout). */
export function stale() {
  return FILES.filter((f) => {
    if (!existsSync(join(SOURCE, f))) return false;
    return !existsSync(join(TARGET, f)) || !readFileSync(join(SOURCE, f)).equals(readFileSync(join(TARGET, f)));
  });
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  if (!FILES.every((f) => existsSync(join(SOURCE, f)))) {
    // Not in a corral checkout (an unpacked tarball): the bundled copy is all there is.
    if (FILES.every((f) => existsSync(join(TARGET, f)))) process.exit(0);
    console.error(`copy-protos: ${FILES.join(', ')} found neither in ${SOURCE} nor in ${TARGET}`);
    process.exit(1);
  }
  const differ = stale();
  if (process.argv.includes('--check')) {
    if (differ.length) {
      console.error(`copy-protos: ${TARGET} differs from ${SOURCE} (${differ.join(', ')}): run node scripts/copy-protos.mjs`);
      process.exit(1);
    }
    process.exit(0);
  }
  for (const f of differ) {
    mkdirSync(dirname(join(TARGET, f)), { recursive: true });
    copyFileSync(join(SOURCE, f), join(TARGET, f));
    console.error(`copy-protos: ${f} from ${SOURCE} -> ${TARGET}`);
  }
}
