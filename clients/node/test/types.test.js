// The TypeScript declarations (index.d.ts) against a typed usage file: tsc --noEmit, strict.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';
import { PACKAGE_ROOT } from './helpers.js';

test('index.d.ts type-checks a typed use of the whole API, and refuses misuse', () => {
  const tsc = join(PACKAGE_ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
  const r = spawnSync(process.execPath, [tsc, '-p', join(PACKAGE_ROOT, 'test', 'types', 'tsconfig.json')], {
    cwd: PACKAGE_ROOT,
    encoding: 'utf8',
  });
  assert.equal(r.status, 0, `tsc failed:\n${r.stdout}${r.stderr}`);
});

test('every runtime export is declared', async () => {
  const runtime = Object.keys(await import('../src/index.js')).sort();
  const { readFileSync } = await import('node:fs');
  const dts = readFileSync(join(PACKAGE_ROOT, 'index.d.ts'), 'utf8');
  const declared = new Set([...dts.matchAll(/^export (?:declare )?(?:const|function|class) (\w+)/gm)].map((m) => m[1]));
  assert.deepEqual(runtime.filter((name) => !declared.has(name)), []);
});
