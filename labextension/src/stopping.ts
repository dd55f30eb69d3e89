// Whether gpuslice is stopping this server on purpose (its owner released the GPU, or its
// idle cull stopped it): the lab has said why, so what follows is no surprise to report.
// Every tab of the server learns of it (the release's and the cull's events).

let why: string | null = null;

/** Note that the server is being stopped, and why (said to the person already). */
export function markStopping(reason: string): void {
  why ??= reason;
}

/** Why gpuslice is stopping this server, or null when it is not. */
export function stoppingReason(): string | null {
  return why;
}
