// prepack: bundle the public proto (corral/v1/corral.proto) into the package's proto/, so the
// published tarball does not depend on the repository layout (worker.proto is internal: left out).
// With --clean (postpack) it removes the copy again when the repository's protos are there.
import { copyFileSync, existsSync, mkdirSync, rmSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const FILES = [join('corral', 'v1', 'corral.proto')];
const pkg = join(dirname(fileURLToPath(import.meta.url)), '..');
const source = join(pkg, '..', '..', 'proto');
const target = join(pkg, 'proto');

if (process.argv.includes('--clean')) {
  // postpack, in a checkout: drop the copy so it never shadows ../../proto.
  if (existsSync(join(source, FILES[0]))) rmSync(target, { recursive: true, force: true });
  process.exit(0);
}
if (!FILES.every((f) => existsSync(join(source, f)))) {
  if (FILES.every((f) => existsSync(join(target, f)))) {
    console.log(`copy-protos: ${source} not found; keeping the bundled ${target}`);
    process.exit(0);
  }
  console.error(`copy-protos: ${FILES.join(', ')} not found in ${source}`);
  process.exit(1);
}
rmSync(target, { recursive: true, force: true });
for (const f of FILES) {
  mkdirSync(dirname(join(target, f)), { recursive: true });
  copyFileSync(join(source, f), join(target, f));
}
console.log(`copy-protos: ${FILES.join(', ')} from ${source} -> ${target}`);
