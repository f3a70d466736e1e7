import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { SkillTarReader } from './tar.js';

function header(name: string, size: number, type = '0', mode = 0o644): Buffer {
  const h = Buffer.alloc(512, 0);
  h.write(name, 0, 100, 'utf8');
  h.write(`${mode.toString(8).padStart(7, '0')}\0`, 100, 8, 'ascii');
  h.write(`${size.toString(8).padStart(11, '0')}\0`, 124, 12, 'ascii');
  h.write('        ', 148, 8, 'ascii');
  h.write(type, 156, 1, 'ascii');
  h.write('ustar\0', 257, 6, 'ascii');
  h.write('00', 263, 2, 'ascii');
  let sum = 0;
  for (const b of h) sum += b;
  h.write(`${sum.toString(8).padStart(6, '0')}\0 `, 148, 8, 'ascii');
  return h;
}
const member = (name: string, data: string | Buffer, type = '0', mode = 0o644) => {
  const d = Buffer.from(data);
  return Buffer.concat([header(name, d.length, type, mode), d, Buffer.alloc((512 - (d.length % 512)) % 512)]);
};
const pax = (records: Record<string, string>) => {
  const body = Object.entries(records).map(([k, v]) => {
    const rest = ` ${k}=${v}\n`;
    let len = rest.length + 2;
    while (String(len).length + rest.length !== len) len = String(len).length + rest.length;
    return `${len}${rest}`;
  }).join('');
  return member('PaxHeader', body, 'x');
};
const SKILL = '---\nname: s\ndescription: d\n---\nbody\n';

/** Feeds an archive in small chunks, as a socket would. */
function read(archive: Buffer, chunk = 97) {
  const r = new SkillTarReader();
  for (let i = 0; i < archive.length; i += chunk) r.push(archive.subarray(i, i + chunk));
  return r.finish();
}
const fails = (archive: Buffer, pattern: RegExp) => {
  let err: unknown;
  try {
    read(archive);
  } catch (e) {
    err = e;
  }
  expect(err).toBeInstanceOf(ApiError);
  expect((err as ApiError).type).toBe('validation.malformed');
  expect((err as Error).message).toMatch(pattern);
};
const END = Buffer.alloc(1024);

describe('SkillTarReader', () => {
  it('reads files in chunks, with PAX long names, executables and a single top-level directory as the root', () => {
    const long = `my-skill/${'d'.repeat(120)}/file.txt`;
    const files = read(Buffer.concat([member('my-skill/', '', '5'), member('my-skill/SKILL.md', SKILL), pax({ path: long }), member('ignored-name', 'long'), member('my-skill/run.sh', '#!/bin/sh\n', '0', 0o755), END]));
    expect(files.map((f) => [f.path, f.executable])).toEqual([['SKILL.md', false], [`${'d'.repeat(120)}/file.txt`, false], ['run.sh', true]]);
    expect(files[1]?.content.toString()).toBe('long');
  });

  it('refuses oversize members from their header, links, escapes and truncation', () => {
    const r = new SkillTarReader();
    r.push(member('SKILL.md', SKILL));
    // Only the header of the 1 MiB + 1 member has arrived: refused already.
    expect(() => r.push(header('big.bin', 1024 * 1024 + 1))).toThrow(/1 MiB/);
    fails(Buffer.concat([member('SKILL.md', SKILL), member('l', '', '2'), END]), /symbolic link/);
    fails(Buffer.concat([member('SKILL.md', SKILL), member('h', '', '1'), END]), /hard link/);
    fails(Buffer.concat([member('SKILL.md', SKILL), member('p', '', '6'), END]), /special file/);
    fails(Buffer.concat([member('SKILL.md', SKILL), member('../x', 'x'), END]), /escapes/);
    fails(Buffer.concat([member('SKILL.md', SKILL), pax({ path: '/etc/passwd' }), member('fine', 'x'), END]), /escapes/);
    fails(Buffer.concat([member('SKILL.md', SKILL), member('x', 'abc')]).subarray(0, 700), /middle of a member/);
    const bad = member('SKILL.md', SKILL);
    bad[0] = 0x41;
    fails(Buffer.concat([bad, END]), /checksum/);
    fails(Buffer.concat([...Array.from({ length: 257 }, (_, i) => member(`f${i}`, 'x')), END]), /256/);
    fails(Buffer.concat([member('a', Buffer.alloc(1024 * 1024)), member('b', Buffer.alloc(1024 * 1024)), header('c', 1)]), /2 MiB/);
  });

  it('stops at 4 MiB of archive', () => {
    const r = new SkillTarReader();
    expect(() => {
      for (let i = 0; i < 5; i++) r.push(Buffer.alloc(1024 * 1024));
    }).toThrow(/4 MiB/);
  });
});
