/**
 * `npm run build:sandbox-image [-- --force]`: builds the default sandbox image offline when the
 * image for the current rootfs content is missing, then tags it `latest`.
 */
import { ensureSandboxImage } from '../../runner-daemon/src/sandbox/image.js';

const force = process.argv.includes('--force');
ensureSandboxImage({ force, onProgress: (line) => process.stdout.write(`${line}\n`) }).then(
  (image) => {
    process.stdout.write(`${image.built ? 'built' : 'present'} ${image.tag}\n`);
  },
  (err: unknown) => {
    process.stderr.write(`sandbox image: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
