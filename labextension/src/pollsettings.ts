// How often the lab asks the server for fresh figures: the extension's settings
// (schema/plugin.json, "Settings > Settings Editor > gpuslice"), read into milliseconds.
// Pure: no JupyterLab import, so the units test it against the schema's defaults.

export interface IPollIntervals {
  /** The status bar's slice, utilization and idle countdown. */
  statusMs: number;
  /** The Jobs panel while it is on screen. */
  jobsMs: number;
  /** The Jobs panel while hidden, only while a job is unfinished (to notify). */
  jobsHiddenMs: number;
  /** The profiles' availability in the "Submit as GPU job" dialog. */
  profilesMs: number;
}

/** Setting name -> field, with the schema's default (seconds) and lower bound. */
export const POLL_SETTINGS: Record<
  string,
  { field: keyof IPollIntervals; defaultSeconds: number; minimumSeconds: number }
> = {
  statusPollSeconds: { field: 'statusMs', defaultSeconds: 5, minimumSeconds: 1 },
  jobsPollSeconds: { field: 'jobsMs', defaultSeconds: 3, minimumSeconds: 1 },
  jobsHiddenPollSeconds: { field: 'jobsHiddenMs', defaultSeconds: 30, minimumSeconds: 5 },
  profilesPollSeconds: { field: 'profilesMs', defaultSeconds: 5, minimumSeconds: 1 }
};

/** The intervals from the settings' composite values; a missing or out-of-range value
 * (the settings registry validates, a hand-edited overrides.json may not) keeps its
 * default or is raised to its minimum. */
export function pollIntervals(settings: Record<string, unknown> = {}): IPollIntervals {
  const out = {} as IPollIntervals;
  for (const [name, spec] of Object.entries(POLL_SETTINGS)) {
    const value = settings[name];
    const seconds =
      typeof value === 'number' && Number.isFinite(value)
        ? Math.max(value, spec.minimumSeconds)
        : spec.defaultSeconds;
    out[spec.field] = Math.round(seconds * 1000);
  }
  return out;
}
