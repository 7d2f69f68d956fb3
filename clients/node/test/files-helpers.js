// Shared by the files tests: local trees to send and a comparison of two trees (kinds,
// permission bits, contents, link targets), as in the Python client's tests.
import { chmodSync, lstatSync, mkdirSync, readdirSync, readFileSync, readlinkSync, symlinkSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

/** A directory with permission bits, an empty file, nested and read-only directories, symlinks. */
export function makeTree(root, big = 0) {
  mkdirSync(root);
  writeFileSync(join(root, 'a.txt'), 'hello\n', { mode: 0o640 });
  chmodSync(join(root, 'a.txt'), 0o640);
  mkdirSync(join(root, 'bin'));
  writeFileSync(join(root, 'bin', 'run.sh'), '#!/bin/sh\necho run\n');
  chmodSync(join(root, 'bin', 'run.sh'), 0o755);
  writeFileSync(join(root, 'empty'), '');
  chmodSync(join(root, 'empty'), 0o600);
  mkdirSync(join(root, 'sub', 'deeper'), { recursive: true });
  writeFileSync(join(root, 'sub', 'deeper', 'f.bin'), Buffer.from([...Array(768).keys()].map((i) => i % 256)));
  mkdirSync(join(root, 'ro'));
  writeFileSync(join(root, 'ro', 'x'), 'x');
  chmodSync(join(root, 'ro', 'x'), 0o444);
  chmodSync(join(root, 'ro'), 0o555);
  symlinkSync('a.txt', join(root, 'link'));
  symlinkSync('nowhere/x', join(root, 'dangling'));
  if (big) writeFileSync(join(root, 'big.bin'), randomBytes(big));
  chmodSync(root, 0o750);
  return root;
}

/** Every node under `root` (itself as ''): [kind, mode, content] or ['link', target]. */
export function snapshot(root) {
  const out = {};
  const visit = (rel, path) => {
    const st = lstatSync(path);
    if (st.isSymbolicLink()) out[rel] = ['link', readlinkSync(path)];
    else if (st.isDirectory()) {
      out[rel] = ['dir', st.mode & 0o7777];
      for (const name of readdirSync(path).sort()) visit(rel ? `${rel}/${name}` : name, join(path, name));
    } else if (st.isFile()) out[rel] = ['file', st.mode & 0o7777, readFileSync(path).toString('base64')];
    else out[rel] = ['other'];
  };
  visit('', root);
  return out;
}

/** So a tree with read-only directories can be removed. */
export function makeWritable(root) {
  const visit = (path) => {
    for (const d of readdirSync(path, { withFileTypes: true })) {
      if (d.isDirectory()) {
        chmodSync(join(path, d.name), 0o755);
        visit(join(path, d.name));
      }
    }
  };
  try {
    chmodSync(root, 0o755);
    visit(root);
  } catch {
    // already gone
  }
}
