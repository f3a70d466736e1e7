/** The Docker engine a runner's sandboxes live in, as the runner and the platform reach it. */
import Docker from 'dockerode';

/** A client of the engine on `socketPath` (`DOCKER_SOCKET`), else of the default one (`DOCKER_HOST` or the local socket). */
export function dockerClient(socketPath?: string): Docker {
  return socketPath ? new Docker({ socketPath }) : new Docker();
}

/** Whether dockerd answers a ping within `timeoutMs`; the runner chooses its sandbox driver from this at start. */
export async function dockerAvailable(docker: Docker = new Docker(), timeoutMs = 2_000): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([
      docker.ping(),
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new Error('ping timeout')), timeoutMs);
      }),
    ]);
    return true;
  } catch {
    return false;
  } finally {
    clearTimeout(timer);
  }
}
