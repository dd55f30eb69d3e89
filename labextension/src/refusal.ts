// What a person reads when the server says no: one clear sentence per refusal.
import { ApiError } from './api';
import type { IProfile } from './types';

/** A user-facing message for a failed action (`doing` is e.g. "Submitting the job"). */
export function refusalMessage(error: unknown, doing: string): string {
  if (!(error instanceof ApiError)) {
    const text = error instanceof Error ? error.message : String(error);
    return `${doing} failed: ${text}`;
  }
  const said = error.message;
  switch (error.status) {
    case 0:
      return `${doing} failed: the server could not be reached. Check your connection and try again.`;
    case 400:
    case 422:
      return `${doing} was refused: ${said}`;
    case 401:
      return `${doing} failed: you are logged out. Reload the page to log in again.`;
    case 403:
      return `${doing} is not allowed: ${said}`;
    case 404:
      // The server's own 404s name what is missing (a job, a notebook, a profile); a bare
      // "Not Found" is a route no extension serves.
      return !said || /^(not found|http 404)$/i.test(said.trim())
        ? `${doing} failed: not found. GPU features may not be enabled on this server.`
        : `${doing} failed: ${said}`;
    case 409:
    case 413:
    case 429:
      // (413: a notebook over the size limit, or job folders over the disk cap; 429: a
      // quota or the limit of unfinished jobs; the message says which and what to do)
      return `${doing} was refused: ${said}`;
    case 503:
      // unreachable, timed out or not configured at all: the message says which
      return `${doing} failed: the GPU service is unavailable (${said}).`;
    case 502:
    case 504:
      return `${doing} failed: the GPU service is unavailable right now (${said}). Try again shortly.`;
    default:
      return `${doing} failed (HTTP ${error.status}): ${said}`;
  }
}

/** One line for a profile in the submit dialog's list, with its live availability. */
export function profileLabel(profile: IProfile): string {
  const name = profile.display_name || profile.name;
  if (forPeopleOnly(profile)) {
    // a spawn would preempt a batch job for it; a batch job queues
    return `${name} — all ${profile.total} in use`;
  }
  if (!profile.available) {
    return `${name} — unavailable${profile.reason ? `: ${profile.reason}` : ''}`;
  }
  if (profile.batch_free !== undefined && profile.batch_total !== undefined) {
    // a split cluster: batch jobs run in the peak pool, not in the one reserved for people
    return `${name} — ${profile.batch_free} of ${profile.batch_total} free for batch jobs`;
  }
  if (profile.free !== null && profile.total !== null) {
    return `${name} — ${profile.free} of ${profile.total} free`;
  }
  return name;
}

/**
 * The profile to preselect: the requested one if still offered, else the first available,
 * else the first at all (a job may queue for a busy profile).
 */
export function defaultProfile(profiles: IProfile[], preferred?: string): string {
  if (preferred && profiles.some(p => p.name === preferred)) {
    return preferred;
  }
  return (profiles.find(p => p.available && !forPeopleOnly(p)) ?? profiles[0])?.name ?? '';
}

/** Available only to an interactive spawn, by preempting a batch job: none is free. */
function forPeopleOnly(profile: IProfile): boolean {
  return Boolean(profile.from_batch) && !profile.free;
}
