// The test daemons' state (socket, log) is never where a workspace-write session may write: not
// under /tmp (a writable root by default) and not in the checkout, which may itself be a clone
// under /tmp. The daemon refuses a session whose writable root contains its state, so with the
// state in the checkout every workspace-write test failed in a clone under /tmp.
import assert from 'node:assert/strict';
import { existsSync, readFileSync, realpathSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { test } from 'node:test';
import { Client } from '../src/index.js';
import * as h from './helpers.js';

const inside = (dir, root) => {
  const rel = relative(root, dir);
  return rel === '' || (!rel.startsWith('..') && !rel.startsWith('/'));
};

test('the daemons keep their state outside /tmp and the checkout, privately, and clean it up', async () => {
  const daemon = await h.startDaemon();
  const dir = realpathSync(daemon.dir);
  try {
    assert.ok(!inside(dir, '/tmp'), `${dir} is under /tmp`);
    assert.ok(!inside(dir, realpathSync(h.REPO_ROOT)), `${dir} is in the checkout ${h.REPO_ROOT}`);
    assert.equal(statSync(dir).mode & 0o777, 0o700);
    // A workspace-write session in a workspace under /tmp, /tmp writable (nothing excluded):
    // accepted, and its commands write both places.
    const ws = h.makeWorkspace();
    const client = new Client(daemon.address);
    try {
      const session = await client.openSession({ cwd: ws, mode: 'workspace-write' });
      assert.ok(session.writableRoots.includes(realpathSync('/tmp')), session.writableRoots.join(', '));
      const marker = join('/tmp', `corral-node-state-${process.pid}`);
      const r = await session.shell(['sh', '-c', `echo ok > out.txt && echo ok > ${marker} && rm ${marker}`]);
      assert.equal(r.exitCode, 0, r.text);
      assert.equal(readFileSync(join(ws, 'out.txt'), 'utf8'), 'ok\n');
      await session.close();
    } finally {
      client.close();
      h.removeWorkspace(ws);
    }
  } finally {
    await daemon.stop();
  }
  assert.equal(existsSync(dir), false, `${dir} left behind`);
});

test('the base directory is never under /tmp, whatever XDG_RUNTIME_DIR says', () => {
  const saved = process.env.XDG_RUNTIME_DIR;
  try {
    process.env.XDG_RUNTIME_DIR = '/tmp';
    assert.ok(!inside(h.stateBase(), '/tmp'), h.stateBase());
    delete process.env.XDG_RUNTIME_DIR;
    assert.ok(!inside(h.stateBase(), '/tmp'), h.stateBase());
  } finally {
    if (saved === undefined) delete process.env.XDG_RUNTIME_DIR;
    else process.env.XDG_RUNTIME_DIR = saved;
  }
});
