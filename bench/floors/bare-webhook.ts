// Floor for bench:automations: a bare Koa handler that reads the body and does the same
// Standard Webhooks HMAC check (standardwebhooks) as the ingest route, then answers 202.
import Koa from 'koa';
import getRawBody from 'raw-body';
import { Webhook } from 'standardwebhooks';

const secret = process.argv[2] ?? '';
const port = Number(process.argv[3] ?? 0);
const wh = new Webhook(secret);
const app = new Koa();
app.use(async (ctx) => {
  const raw = await getRawBody(ctx.req, { limit: 1024 * 1024, encoding: 'utf8' });
  try {
    wh.verify(raw, ctx.headers as Record<string, string>);
    ctx.status = 202;
    ctx.body = { ok: true };
  } catch {
    ctx.status = 401;
  }
});
const server = app.listen(port, '127.0.0.1', () => {
  const addr = server.address();
  process.stdout.write(`${typeof addr === 'object' && addr ? addr.port : port}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
