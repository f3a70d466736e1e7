// Floor for bench:api: a bare Koa handler answering the same JSON body, nothing else.
import Koa from 'koa';

const body = JSON.parse(process.argv[2] ?? '{}') as unknown;
const port = Number(process.argv[3] ?? 0);
const app = new Koa();
app.use((ctx) => {
  ctx.body = body;
});
const server = app.listen(port, '127.0.0.1', () => {
  const addr = server.address();
  process.stdout.write(`${typeof addr === 'object' && addr ? addr.port : port}\n`);
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
