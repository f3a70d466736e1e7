import { describe, expect, it } from 'vitest';
import type { DocumentStore } from '@agentplane/store';
import { checkSourceUrl, SkillSourceService, type SkillSourceDoc } from './service.js';

const prod = { development: false, allowPrivate: false };
const dev = { development: true, allowPrivate: false };
const open = { development: false, allowPrivate: true };
const source = (url: string) => ({ id: 'sksrc_test', url }) as SkillSourceDoc;
const service = (egress = dev) => new SkillSourceService({} as DocumentStore, true, egress);

describe('skill source addresses and the outbound guard', () => {
  it('reads the host of every address form, in any spelling, before it decides', () => {
    for (const url of [
      'https://127.0.0.1/s.git', 'https://0x7f.1/s.git', 'https://localhost./s.git', 'https://[::ffff:127.0.0.1]/s.git', 'ssh://git@0x7f000001/s.git',
      'ssh://git@[::1]:2222/s.git', 'git@127.1:s.git', 'git@LOCALHOST:s.git', 'git@169.254.169.254:s.git', 'ssh://git@10.0.0.1/s.git', 'https://[fd00::1]/s.git',
    ]) expect(() => checkSourceUrl(url, false, prod), url).toThrow(/loopback|private/);
    expect(() => checkSourceUrl('https://127.0.0.1/s.git', false, dev)).not.toThrow();
    expect(() => checkSourceUrl('https://10.0.0.1/s.git', false, dev)).toThrow(/private/);
    expect(() => checkSourceUrl('git@10.0.0.1:s.git', false, open)).not.toThrow();
    expect(() => checkSourceUrl('https://git.example.com/s.git', false, prod)).not.toThrow();
    expect(() => checkSourceUrl('ssh://git@exa$mple.com/s.git', false, prod)).toThrow(/not a git address/);
  });

  it('refuses an address that carries a credential (it would be stored and shown to readers)', () => {
    for (const url of [
      'https://x-access-token:ghp_secret@github.com/o/r.git', 'https://ghp_secret@github.com/o/r.git', 'ssh://git:secret@github.com/o/r.git',
    ]) expect(() => checkSourceUrl(url, false, prod), url).toThrow(/credential/);
    // A user name alone is how ssh addresses name their account.
    expect(() => checkSourceUrl('ssh://git@github.com/o/r.git', false, prod)).not.toThrow();
    expect(() => checkSourceUrl('git@github.com:o/r.git', false, prod)).not.toThrow();
  });

  it('holds git to the address it checked, and follows no redirect', async () => {
    const https = await service().remote(source('https://LocalHost:8443/team/s.git'));
    // Handed to git as parsed here: the resolve entry names the very host curl reads.
    expect(https.url).toBe('https://localhost:8443/team/s.git');
    expect(https.env).toMatchObject({ GIT_CONFIG_COUNT: '2', GIT_CONFIG_KEY_0: 'http.followRedirects', GIT_CONFIG_VALUE_0: 'false', GIT_CONFIG_KEY_1: 'http.curloptResolve' });
    expect(https.env.GIT_CONFIG_VALUE_1).toMatch(/^localhost:8443:(127\.0\.0\.1|\[::1\])$/);
    // A literal address needs no entry; the redirect rule stays.
    expect((await service().remote(source('https://127.0.0.1/s.git'))).env).toEqual({ GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'http.followRedirects', GIT_CONFIG_VALUE_0: 'false' });
    const ssh = await service().remote(source('git@localhost:team/s.git'));
    expect(ssh.env).toMatchObject({ GIT_CONFIG_COUNT: '1', GIT_CONFIG_KEY_0: 'core.sshCommand' });
    expect(ssh.env.GIT_CONFIG_VALUE_0).toMatch(/^ssh -o HostName=(127\.0\.0\.1|::1) -o HostKeyAlias=localhost$/);
    expect(await service().remote(source('/srv/git/skills.git'))).toEqual({ url: '/srv/git/skills.git', env: {} });
  });

  it('extends the api host\'s own GIT_SSH_COMMAND (its key, its known hosts) with the pin', async () => {
    const before = process.env.GIT_SSH_COMMAND;
    process.env.GIT_SSH_COMMAND = 'ssh -i /keys/deploy -o UserKnownHostsFile=/keys/known_hosts';
    try {
      const ssh = await service().remote(source('git@localhost:team/s.git'));
      expect(ssh.env.GIT_CONFIG_VALUE_0).toMatch(/^ssh -i \/keys\/deploy -o UserKnownHostsFile=\/keys\/known_hosts -o HostName=(127\.0\.0\.1|::1) -o HostKeyAlias=localhost$/);
    } finally {
      if (before === undefined) delete process.env.GIT_SSH_COMMAND;
      else process.env.GIT_SSH_COMMAND = before;
    }
  });

  it('refuses a host that resolves to an internal address before git runs', async () => {
    await expect(service(prod).remote(source('https://localhost/s.git'))).rejects.toThrow(/resolves to a private or reserved address/);
    await expect(service(prod).remote(source('ssh://git@127.0.0.1/s.git'))).rejects.toMatchObject({ type: 'validation.malformed' });
  });
});
