/**
 * `npm run build:sandbox-image [-- --force] [-- --browser]`: builds the default sandbox image
 * offline when the image for the current rootfs content is missing, then tags it `latest`.
 * `--browser` builds the browser variant (the default rootfs plus Chromium) instead.
 */
import { parseArgs } from 'node:util';
import { ensureSandboxImage } from '../../runner-daemon/src/sandbox/image.js';
import { ensureBrowserImage } from '../../runner-daemon/src/sandbox/browser-image.js';

const USAGE = `Usage: npm run build:sandbox-image [-- options]

Builds the default sandbox image offline when the image for the current rootfs content is
missing, then tags it latest. No registry is contacted.

Options:
  --force     build even when the image for the current content exists
  --browser   build the browser variant (the default rootfs plus this machine's Debian chromium) instead
  -h, --help  this text
`;

let args: { force?: boolean; browser?: boolean; help?: boolean };
try {
  args = parseArgs({ args: process.argv.slice(2), strict: true, allowPositionals: false, options: { force: { type: 'boolean' }, browser: { type: 'boolean' }, help: { type: 'boolean', short: 'h' } } }).values;
} catch (err) {
  // An option it does not know is a mistake, never a build with settings it did not mean.
  process.stderr.write(`build:sandbox-image: ${err instanceof Error ? err.message : String(err)}\n\n${USAGE}`);
  process.exit(2);
}
if (args.help) {
  process.stdout.write(USAGE);
  process.exit(0);
}
const force = args.force === true;
const browser = args.browser === true;
const label = browser ? 'browser image' : 'sandbox image';
(browser ? ensureBrowserImage : ensureSandboxImage)({ force, onProgress: (line) => process.stdout.write(`${line}\n`) }).then(
  (image) => {
    process.stdout.write(`${image.built ? 'built' : 'present'} ${image.tag}\n`);
  },
  (err: unknown) => {
    process.stderr.write(`${label}: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
