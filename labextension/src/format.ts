// Pure formatting helpers shared by the status bar, the warning and the jobs panel.

function pad2(value: number): string {
  return value.toString().padStart(2, '0');
}

/** "1h 05m", "4m 07s", "42s"; negative or missing input becomes "0s". */
export function formatDuration(seconds: number | null | undefined): string {
  const total = Math.max(0, Math.floor(Number(seconds) || 0));
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const secs = total % 60;
  if (hours > 0) {
    return `${hours}h ${pad2(minutes)}m`;
  }
  if (minutes > 0) {
    return `${minutes}m ${pad2(secs)}s`;
  }
  return `${secs}s`;
}

/** Clock-style countdown "4:07" or "1:02:03" (what the status bar shows). */
export function formatCountdown(seconds: number): string {
  const total = Math.max(0, Math.ceil(seconds));
  const hours = Math.floor(total / 3600);
  const minutes = Math.floor((total % 3600) / 60);
  const secs = total % 60;
  return hours > 0 ? `${hours}:${pad2(minutes)}:${pad2(secs)}` : `${minutes}:${pad2(secs)}`;
}

/** The local time of day "14:03:07" of a moment (ms since the epoch). */
export function formatClock(ms: number): string {
  const at = new Date(ms);
  return `${pad2(at.getHours())}:${pad2(at.getMinutes())}:${pad2(at.getSeconds())}`;
}

/** Seconds from `now` until an ISO deadline; null when there is no (valid) deadline. */
export function secondsUntil(deadline: string | null | undefined, now: number): number | null {
  if (!deadline) {
    return null;
  }
  const at = Date.parse(deadline);
  if (Number.isNaN(at)) {
    return null;
  }
  return (at - now) / 1000;
}

/** Seconds elapsed since an ISO time; null when missing or unparsable. */
export function secondsSince(at: string | null | undefined, now: number): number | null {
  const until = secondsUntil(at, now);
  return until === null ? null : Math.max(0, -until);
}

/** "512 MiB", "1.5 GiB"; null → "–". */
export function formatMemory(mib: number | null | undefined): string {
  if (mib === null || mib === undefined || Number.isNaN(mib)) {
    return '–';
  }
  if (mib >= 1024) {
    const gib = mib / 1024;
    return `${gib >= 10 ? gib.toFixed(0) : gib.toFixed(1)} GiB`;
  }
  return `${Math.round(mib)} MiB`;
}

/** Utilization in percent (0–100) as "37%"; null → "–". */
export function formatPercent(value: number | null | undefined): string {
  if (value === null || value === undefined || Number.isNaN(value)) {
    return '–';
  }
  return `${Math.round(Math.min(100, Math.max(0, value)))}%`;
}
