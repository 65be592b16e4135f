// Builds the web console into OUTDIR: app.js (src/app.js and xterm.js, one minified script),
// app.css (xterm's stylesheet and src/app.css) and index.html. Same sources, same bytes out.
//   node ui/build.mjs OUTDIR
import { build } from 'esbuild';
import { copyFile, mkdir } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, 'src');
const outArg = process.argv[2];
if (!outArg) {
  console.error('usage: node build.mjs OUTDIR');
  process.exit(2);
}
const out = resolve(outArg);
await mkdir(out, { recursive: true });

const common = {
  bundle: true,
  minify: true,
  sourcemap: false,
  legalComments: 'eof', // keep the licence notices of what is bundled
  charset: 'utf8',
  logLevel: 'warning',
  absWorkingDir: here,
  nodePaths: [join(here, 'node_modules')],
};

// The page's only script: spaced's Content-Security-Policy allows scripts from /ui/ alone, so
// everything is in this one file (no inline script, no eval, nothing from another site).
await build({
  ...common,
  entryPoints: [join(src, 'app.js')],
  outfile: join(out, 'app.js'),
  format: 'iife',
  platform: 'browser',
  target: ['es2020', 'chrome100', 'firefox100', 'safari15'],
});

await build({
  ...common,
  stdin: {
    contents: '@import "@xterm/xterm/css/xterm.css";\n@import "./app.css";\n',
    resolveDir: src,
    sourcefile: 'bundle.css',
    loader: 'css',
  },
  outfile: join(out, 'app.css'),
  target: ['chrome100', 'firefox100', 'safari15'],
});

await copyFile(join(src, 'index.html'), join(out, 'index.html'));
