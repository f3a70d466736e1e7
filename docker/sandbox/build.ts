/**
 * `npm run build:sandbox-image [-- --force] [-- --browser]`: builds the default sandbox image
 * offline when the image for the current rootfs content is missing, then tags it `latest`.
 * `--browser` builds the browser variant (the default rootfs plus Chromium) instead.
 */
import { ensureSandboxImage } from '../../runner-daemon/src/sandbox/image.js';
import { ensureBrowserImage } from '../../runner-daemon/src/sandbox/browser-image.js';

const force = process.argv.includes('--force');
const browser = process.argv.includes('--browser');
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
