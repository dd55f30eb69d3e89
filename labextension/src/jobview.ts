// Pure presentation logic for batch jobs: state badges, progress, checkpoint age, lost work,
// and which jobs just finished (for notifications).
import { formatDuration, secondsSince } from './format';
import { JOBS_SCHEMA_ID, type IJob } from './types';

export type BadgeTone = 'waiting' | 'active' | 'warn' | 'good' | 'bad' | 'muted';

export interface IBadge {
  label: string;
  tone: BadgeTone;
  terminal: boolean;
}

const BADGES: Record<string, IBadge> = {
  pending: { label: 'pending', tone: 'waiting', terminal: false },
  queued: { label: 'queued', tone: 'waiting', terminal: false },
  requeued: { label: 'requeued', tone: 'waiting', terminal: false },
  starting: { label: 'starting', tone: 'active', terminal: false },
  running: { label: 'running', tone: 'active', terminal: false },
  checkpointing: { label: 'checkpointing', tone: 'active', terminal: false },
  preempting: { label: 'preempting', tone: 'warn', terminal: false },
  preempted: { label: 'preempted', tone: 'warn', terminal: false },
  cancelling: { label: 'cancelling', tone: 'warn', terminal: false },
  completed: { label: 'completed', tone: 'good', terminal: true },
  failed: { label: 'failed', tone: 'bad', terminal: true },
  cancelled: { label: 'cancelled', tone: 'muted', terminal: true },
  canceled: { label: 'cancelled', tone: 'muted', terminal: true },
  'timed-out': { label: 'timed out', tone: 'bad', terminal: true }
};

/** The badge for a state; unknown states are shown as they are, as not finished. */
export function stateBadge(state: string): IBadge {
  return BADGES[state] ?? { label: state || 'unknown', tone: 'muted', terminal: false };
}

export function isTerminal(state: string): boolean {
  return stateBadge(state).terminal;
}

export interface IProgress {
  /** 0..1, or null when the total is not known yet. */
  fraction: number | null;
  text: string;
}

export function progress(
  job: Pick<IJob, 'cells_done' | 'cells_total'> & { state?: string }
): IProgress {
  const done = Math.max(0, job.cells_done ?? 0);
  const total = job.cells_total ?? 0;
  if (!total || total <= 0) {
    // (the runner counts the cells once it runs: until then, say what the job is doing)
    const doing =
      job.state === 'starting'
        ? 'starting'
        : job.state === 'running' || job.state === 'preempting'
          ? 'running'
          : 'not started';
    return { fraction: null, text: done ? `${done} cells done` : doing };
  }
  const clamped = Math.min(done, total);
  return { fraction: clamped / total, text: `${clamped} / ${total} cells` };
}

export function checkpointAge(
  job: Pick<IJob, 'last_checkpoint_at' | 'state'>,
  now: number
): string {
  if (isTerminal(job.state)) {
    return ''; // a finished job's checkpoints matter no more
  }
  const age = secondsSince(job.last_checkpoint_at, now);
  if (age === null) {
    return job.state === 'running' || job.state === 'preempting' ? 'no checkpoint yet' : '';
  }
  return `checkpoint ${formatDuration(age)} ago`;
}

/** When it was submitted, started and finished, and how long it ran or has waited. */
export function jobTimes(
  job: Pick<IJob, 'state' | 'submitted_at' | 'started_at' | 'finished_at'> &
    Partial<Pick<IJob, 'run_seconds' | 'attempt_started_at'>>,
  now: number
): string {
  const ago = (at: string | null | undefined) => {
    const s = secondsSince(at, now);
    return s === null ? null : `${formatDuration(s)} ago`;
  };
  const span = (from: string | null, to: string | null) => {
    const a = Date.parse(from ?? ''),
      b = to ? Date.parse(to) : now;
    return Number.isNaN(a) || Number.isNaN(b) ? null : formatDuration(Math.max(0, (b - a) / 1000));
  };
  const submitted = ago(job.submitted_at);
  if (!job.started_at) {
    const waited = span(job.submitted_at, isTerminal(job.state) ? job.finished_at : null);
    return submitted ? `submitted ${submitted}` + (waited ? `, waited ${waited}` : '') : '';
  }
  if (job.state === 'starting' && !job.run_seconds) {
    // placed on its slice, its runner not yet running: nothing has run for any time
    return `placed ${ago(job.attempt_started_at ?? job.started_at) ?? ''}, starting`;
  }
  if (job.run_seconds === undefined) {
    // (a service without run times: the span since the first start)
    const ran = span(job.started_at, isTerminal(job.state) ? job.finished_at : null);
    if (isTerminal(job.state)) {
      const ended = ago(job.finished_at);
      return [ended ? `ended ${ended}` : null, ran ? `ran ${ran}` : null]
        .filter(Boolean)
        .join(', ');
    }
    return `started ${ago(job.started_at) ?? ''}` + (ran ? `, running ${ran}` : '');
  }
  // Time on a GPU, not since the first start: a preempted job waits in the queue between
  // runs, and that wait is not run time (nor counted against its max runtime).
  const before = job.run_seconds;
  const current = secondsSince(job.attempt_started_at, now);
  if (isTerminal(job.state)) {
    const ended = ago(job.finished_at);
    return [ended ? `ended ${ended}` : null, `ran ${formatDuration(before)}`]
      .filter(Boolean)
      .join(', ');
  }
  if (current === null) {
    // back in the queue after a run (preempted, or its runner died)
    return `waiting to run again, ran ${formatDuration(before)} so far`;
  }
  if (job.state === 'starting') {
    return `placed ${ago(job.attempt_started_at) ?? ''}, starting, ran ${formatDuration(before)} before`;
  }
  if (before) {
    return `running ${formatDuration(current)} this run, ${formatDuration(before + current)} in all`;
  }
  return `started ${ago(job.started_at) ?? ''}, running ${formatDuration(current)}`;
}

/** Why the job was last preempted, as the service recorded it (null: never, or not said). */
export function preemptionReason(job: Pick<IJob, 'transitions'>): string | null {
  const asked = [...(job.transitions ?? [])].reverse().find(t => t.state === 'preempting');
  return asked?.reason || null;
}

/**
 * The latest preemption, as the service recorded it: why, and what became of the work
 * ("checkpointed and exited; 0.1s of work to redo"). Empty when never preempted.
 */
export function lastPreemption(job: Pick<IJob, 'state' | 'transitions'>, now: number): string {
  const history = job.transitions ?? [];
  let at = -1;
  history.forEach((t, i) => {
    if (t.state === 'preempting') {
      at = i;
    }
  });
  if (at < 0) {
    return '';
  }
  const asked = history[at];
  const why = asked.reason ? `: ${asked.reason}` : '';
  if (job.state === 'preempting') {
    return `being preempted${why}`;
  }
  const done = history.slice(at + 1).find(t => t.state === 'preempted');
  const when = secondsSince(done?.at ?? asked.at, now);
  const ago = when === null ? '' : ` ${formatDuration(when)} ago`;
  return `preempted${ago}${why}` + (done?.reason ? ` — ${done.reason}` : '');
}

/** What cancelling ``job`` costs, asked before it is cancelled. */
export function cancelQuestion(
  job: Pick<IJob, 'id' | 'name' | 'state' | 'last_checkpoint_at'>
): string {
  const which = `"${job.name || job.id}" (#${job.id})`;
  if (job.state === 'queued') {
    return `Cancel ${which}? It leaves the queue; resubmitting it later queues it anew.`;
  }
  const since = job.last_checkpoint_at ? 'since its last checkpoint' : 'so far';
  return `Cancel ${which}? It is stopped now, and its work ${since} is lost.`;
}

export function lostWork(
  job: Pick<IJob, 'lost_work_seconds' | 'restarts'> & { preemptions?: number }
): string {
  // restarts count every requeue: preemptions and runs whose runner died
  const restarts = job.restarts ?? 0;
  const preemptions = Math.min(job.preemptions ?? 0, restarts);
  const crashes = restarts - preemptions;
  const lost = job.lost_work_seconds ?? 0;
  if (!restarts && !lost) {
    return '';
  }
  const times = (n: number) => (n === 1 ? 'once' : n === 2 ? 'twice' : `${n} times`);
  return [
    preemptions ? `preempted ${times(preemptions)}` : null,
    crashes ? `restarted after a crash ${times(crashes)}` : null,
    `${formatDuration(lost)} of work lost`
  ]
    .filter(Boolean)
    .join(', ');
}

/**
 * Jobs preempted since the previous poll (their count went up): `previous` maps a job's id
 * to its count then. Jobs seen for the first time are not reported.
 */
export function newlyPreempted(previous: Map<string, number>, jobs: IJob[]): IJob[] {
  return jobs.filter(job => {
    const before = previous.get(String(job.id));
    return before !== undefined && (job.preemptions ?? 0) > before;
  });
}

/**
 * Jobs that were seen unfinished before and are finished now. Jobs seen for the first time
 * are not reported: opening the panel must not replay old notifications.
 */
export function newlyFinished(previous: Map<string, string>, jobs: IJob[]): IJob[] {
  return jobs.filter(job => {
    const before = previous.get(String(job.id));
    return before !== undefined && !isTerminal(before) && isTerminal(job.state);
  });
}

/** Newest first: by submission time, then id for a stable order. */
export function sortJobs(jobs: IJob[]): IJob[] {
  return [...jobs].sort((a, b) => {
    const at = Date.parse(a.submitted_at ?? '') || 0;
    const bt = Date.parse(b.submitted_at ?? '') || 0;
    return bt - at || String(b.id).localeCompare(String(a.id), undefined, { numeric: true });
  });
}

/**
 * The notebook "Open output" opens: the output path itself when it is a notebook, else
 * `output.ipynb` in the job's folder, which holds it once the job has finished.
 */
export function outputNotebook(
  job: Pick<IJob, 'output_path' | 'state'> & { cells_done?: number | null }
): string | null {
  const path = job.output_path?.replace(/\/+$/, '');
  if (!path) {
    return null;
  }
  if (path.endsWith('.ipynb')) {
    return path;
  }
  if (!isTerminal(job.state)) {
    return null;
  }
  // A job stopped from outside (cancelled, or past its max runtime) keeps the output of
  // the cells that had finished, if any had: its runner is killed mid-cell and writes no
  // more. (A failed job's runner writes the failing cell's output before it ends.)
  const stopped = ['cancelled', 'canceled', 'timed-out'].includes(job.state);
  return stopped && !job.cells_done ? null : `${path}/output.ipynb`;
}

export interface IJobEvent {
  job_id: string;
  name: string;
  state: string;
  output_path: string | null;
  error: string | null;
}

/** A "job finished" event from the server, or null for any other event. */
export function asJobEvent(event: {
  schema_id?: string;
  [key: string]: unknown;
}): IJobEvent | null {
  if (event.schema_id !== JOBS_SCHEMA_ID || event.job_id === undefined || !event.state) {
    return null;
  }
  const text = (value: unknown): string | null =>
    typeof value === 'string' && value ? value : null;
  return {
    job_id: String(event.job_id),
    name: text(event.name) ?? String(event.job_id),
    state: String(event.state),
    output_path: text(event.output_path),
    error: text(event.error)
  };
}
