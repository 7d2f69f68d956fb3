// postinstall: make `npm install ./clients/node` work the way `pip install ./clients/python` does.
//
// npm installs a directory dependency outside the project as a symlink to it, and installs none of
// the directory's own dependencies (npm's documented behaviour, npm/cli#3318), while Node resolves
// them from the directory's real path: the first import would fail with ERR_MODULE_NOT_FOUND
// '@grpc/grpc-js'. So when this package is linked (it does not sit in a node_modules directory)
// and its dependencies cannot be resolved from here, install them here, from the lock file, the
// production ones only. Everywhere else (a copy in node_modules, a checkout that has run
// `npm ci`) it does nothing. The protos need no step: src/proto.js reads the repository's proto/
// and a copy installed from the directory carries proto/ (see scripts/copy-protos.mjs).
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, realpathSync } from 'node:fs';
import { dirname, join, parse, sep } from 'node:path';
import { fileURLToPath } from 'node:url';

const pkgDir = realpathSync(join(dirname(fileURLToPath(import.meta.url)), '..'));
const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));

/** Whether Node would find `name` from this package (its node_modules lookup, walking up). */
function resolvable(name) {
  for (let dir = pkgDir; ; dir = dirname(dir)) {
    if (existsSync(join(dir, 'node_modules', name, 'package.json'))) return true;
    if (dir === parse(dir).root) return false;
  }
}

const inNodeModules = pkgDir.split(sep).includes('node_modules');
const missing = Object.keys(pkg.dependencies ?? {}).filter((name) => !resolvable(name));
if (inNodeModules || missing.length === 0) process.exit(0);

// A nested npm must not inherit the outer install's settings (its prefix is the other project).
const keep = new Set(['npm_config_cache', 'npm_config_cafile', 'npm_config_userconfig', 'npm_config_globalconfig', 'npm_config_registry']);
const env = Object.fromEntries(
  Object.entries(process.env).filter(([k]) => !(k.startsWith('npm_') || k === 'INIT_CWD') || keep.has(k)),
);
const npmCli = process.env.npm_execpath;
const [cmd, pre] = npmCli && existsSync(npmCli) ? [process.execPath, [npmCli]] : ['npm', []];
const verb = existsSync(join(pkgDir, 'package-lock.json')) ? ['ci'] : ['install', '--no-save'];
const args = [...pre, ...verb, '--omit=dev', '--ignore-scripts', '--no-audit', '--no-fund', '--prefix', pkgDir];
console.error(`@corral/client: linked from ${pkgDir}; installing its dependencies there (${missing.join(', ')})`);
const r = spawnSync(cmd, args, { cwd: pkgDir, env, stdio: ['ignore', 'inherit', 'inherit'] });
if (r.status !== 0) {
  console.error(
    `@corral/client: installing its dependencies in ${pkgDir} failed (${r.error?.message ?? `exit ${r.status}`}); ` +
      `run \`npm ci --omit=dev\` there, or install a copy instead: npm install --install-links ${pkgDir}`,
  );
  process.exit(1);
}
