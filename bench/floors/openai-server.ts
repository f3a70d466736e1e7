// A local OpenAI-compatible streaming server in its own process (the provider both paths call).
// argv[2]: JSON of Behavior overrides. Prints its base URL on stdout.
import { startOpenAiServer, type Behavior } from '../../test/fixtures/provider-servers.js';

const init = JSON.parse(process.argv[2] ?? '{}') as Partial<Behavior>;
const s = await startOpenAiServer(init);
process.stdout.write(`${s.url}\n`);
process.on('SIGTERM', () => void s.close().then(() => process.exit(0)));
