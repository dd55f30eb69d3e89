// Pure presentation logic for batch jobs: state badges, progress, checkpoint age, lost work,
// and which jobs just finished (for notifications).
import { formatDuration, secondsSince, secondsUntil } from './format';
import { JOBS_SCHEMA_ID, type IJob, type ITransition } from './types';

export type BadgeTone = 'waiting' | 'active' | 'warn' | 'good' | 'bad' | 'muted';

export interface IBadge {
  label: string;
  tone: BadgeTone;
  terminal: boolean;
}

// One badge for each state the service emits: the Job schema's `state` enum in
// docs/openapi.yaml (tests/labextension/test_states.py holds them equal).
export const BADGES: Record<string, IBadge> = {
  queued: { label: 'queued', tone: 'waiting', terminal: false },
  starting: { label: 'starting', tone: 'active', terminal: false },
  running: { label: 'running', tone: 'active', terminal: false },
  preempting: { label: 'preempting', tone: 'warn', terminal: false },
  preempted: { label: 'preempted', tone: 'warn', terminal: false },
  completed: { label: 'completed', tone: 'good', terminal: true },
  failed: { label: 'failed', tone: 'bad', terminal: true },
  cancelled: { label: 'cancelled', tone: 'muted', terminal: true },
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

type PreemptionJob = Pick<IJob, 'state' | 'transitions'> & {
  preempt_deadline?: string | null;
};

/** The latest preemption request in a job's history, and what followed it. */
function latestPreemption(job: PreemptionJob): {
  at: number;
  asked: ITransition;
  outcome: ITransition | null;
} | null {
  const history = job.transitions ?? [];
  let at = -1;
  history.forEach((t, i) => {
    if (t.state === 'preempting') {
      at = i;
    }
  });
  if (at < 0) {
    return null;
  }
  // the first move out of "preempting": requeued after a checkpoint or a kill, or the run
  // ended on its own inside the grace period (completed, failed), or it was cancelled
  const outcome = history.slice(at + 1).find(t => t.state !== 'preempting') ?? null;
  return { at, asked: history[at], outcome };
}

/** What is left of a preempting job's grace period, as "up to 58s" (or "its grace period"). */
function graceLeft(job: PreemptionJob, now: number): string {
  const left = secondsUntil(job.preempt_deadline ?? null, now);
  return left === null ? 'its grace period' : `up to ${formatDuration(Math.max(0, left))}`;
}

/** What became of a preemption, in words ("" while it is under way). */
function outcomeText(outcome: ITransition): string {
  if (outcome.state === 'preempted') {
    // the service's words: "checkpointed and exited; 0s of work to redo", "killed after
    // its 1 min grace period; 1m 31s of work to redo"
    return `${outcome.reason || 'stopped'}; requeued`;
  }
  if (outcome.state === 'completed') {
    return 'finished inside its grace period; nothing to requeue';
  }
  return `${stateBadge(String(outcome.state)).label} while being preempted`;
}

/**
 * The latest preemption, as the service recorded it: why, and what became of the work
 * ("checkpointed and exited; 0s of work to redo"). Empty when never preempted.
 */
export function lastPreemption(job: PreemptionJob, now: number): string {
  const found = latestPreemption(job);
  if (!found) {
    return '';
  }
  const { asked, outcome } = found;
  const why = asked.reason ? `: ${asked.reason}` : '';
  if (job.state === 'preempting' || !outcome) {
    return `asked to checkpoint${why}; has ${graceLeft(job, now)} before it is stopped`;
  }
  const when = secondsSince(outcome.at ?? asked.at ?? null, now);
  const ago = when === null ? '' : ` ${formatDuration(when)} ago`;
  return `preempted${ago}${why} — ${outcomeText(outcome)}`;
}

export interface IPreemptionNews {
  /** One per preemption and phase: a notification is shown once for each key. */
  key: string;
  type: 'warning' | 'info';
  message: string;
}

/**
 * What to tell the researcher of a job's latest preemption, as it happens: first that it is
 * asked to checkpoint and how long it has, then what came of it (requeued after a
 * checkpoint, killed after the grace period, finished inside it). Null when there is
 * nothing to say (never preempted; or an end the finished-job notification says).
 */
export function preemptionNews(
  job: PreemptionJob & Pick<IJob, 'id' | 'name'>,
  now: number,
  limit: number
): IPreemptionNews | null {
  const found = latestPreemption(job);
  if (!found) {
    return null;
  }
  const { at, asked, outcome } = found;
  const name = job.name || String(job.id);
  const fit = (long: string, short: string) => (long.length <= limit ? long : short);
  const base = `${job.id}#${at}`;
  if (job.state === 'preempting' || !outcome) {
    const left = graceLeft(job, now);
    const tail = `; it has ${left} before it is stopped.`;
    return {
      key: `${base}:asked`,
      type: 'warning',
      message: fit(
        `GPU job ${name} is asked to checkpoint (${asked.reason})${tail}`,
        `GPU job ${name} is asked to checkpoint and give its GPU back${tail}`
      )
    };
  }
  if (outcome.state !== 'preempted') {
    return null; // it ended: the finished-job notification says how (finishedMessage)
  }
  const said = outcomeText(outcome);
  return {
    key: `${base}:done`,
    type: 'info',
    message: fit(`GPU job ${name} was preempted: ${said}.`, `GPU job ${name}: ${said}.`)
  };
}

/** The notification of a job that finished: inside its grace period, when it was being
 * preempted, it says so (it was told it was asked to checkpoint, and nothing is requeued). */
export function finishedMessage(job: PreemptionJob & Pick<IJob, 'name' | 'id'>): string {
  const name = job.name || String(job.id);
  const found = latestPreemption(job);
  // (the job as last polled may not have its end in its history yet)
  const ended = !found?.outcome || found.outcome.state === 'completed';
  const inGrace = job.state === 'completed' && found && ended ? ' inside its grace period' : '';
  return `GPU job ${name} ${stateBadge(job.state).label}${inGrace}`;
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
  // restarts: runs started again after the runner died; preemptions are counted apart
  const crashes = job.restarts ?? 0;
  const preemptions = job.preemptions ?? 0;
  const lost = job.lost_work_seconds ?? 0;
  if (!crashes && !preemptions && !lost) {
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
  const stopped = ['cancelled', 'timed-out'].includes(job.state);
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
