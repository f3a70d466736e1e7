import { pino, type Logger, type LevelWithSilent } from 'pino';

export type { Logger };

export interface LoggerOptions {
  name: string;
  level?: LevelWithSilent;
}

/** Structured JSON logs on stdout; secrets are redacted wherever they appear by name. */
export function createLogger(options: LoggerOptions): Logger {
  return pino({
    name: options.name,
    level: options.level ?? 'info',
    base: { service: options.name, pid: process.pid },
    timestamp: pino.stdTimeFunctions.isoTime,
    redact: {
      paths: [
        'secret', '*.secret', 'root_key', '*.root_key', 'authorization', '*.authorization',
        'req.headers.authorization', 'headers.authorization', 'code', '*.code', 'credential', '*.credential',
        'api_key', '*.api_key', 'token', '*.token',
      ],
      censor: '[redacted]',
    },
  });
}
