import {
  asJobEvent,
  cancelQuestion,
  checkpointAge,
  isTerminal,
  finishedMessage,
  lastPreemption,
  lostWork,
  newlyFinished,
  jobTimes,
  outputNotebook,
  preemptionNews,
  progress,
  sortJobs,
  stateBadge
} from '../src/jobview';
import type { IJob } from '../src/types';

function job(overrides: Partial<IJob>): IJob {
  return {
    id: '1',
    name: 'train.ipynb',
    user: 'alice',
    state: 'queued',
    profile: 'share-250',
    priority: 'preemptible',
    checkpoint_interval: 600,
    max_runtime: null,
    parameters: {},
    restarts: 0,
    lost_work_seconds: 0,
    cells_done: 0,
    cells_total: null,
    last_checkpoint_at: null,
    submitted_at: '2026-01-01T12:00:00Z',
    started_at: null,
    finished_at: null,
    error: null,
    output_path: null,
    log_tail: null,
    transitions: [],
    ...overrides
  };
}

describe('job presentation', () => {
  it('maps states to badges; unknown states are shown, not finished', () => {
    expect(stateBadge('running')).toEqual({ label: 'running', tone: 'active', terminal: false });
    expect(stateBadge('completed').tone).toBe('good');
    expect(stateBadge('failed').tone).toBe('bad');
    expect(stateBadge('preempted').tone).toBe('warn');
    expect(stateBadge('defrosting')).toEqual({
      label: 'defrosting',
      tone: 'muted',
      terminal: false
    });
    expect(isTerminal('cancelled')).toBe(true);
    expect(isTerminal('queued')).toBe(false);
    expect(stateBadge('timed-out')).toEqual({ label: 'timed out', tone: 'bad', terminal: true });
  });

  it('shows progress in cells, clamped, and unknown totals without a fraction', () => {
    expect(progress({ cells_done: 3, cells_total: 12 })).toEqual({
      fraction: 0.25,
      text: '3 / 12 cells'
    });
    expect(progress({ cells_done: 14, cells_total: 12 }).fraction).toBe(1);
    expect(progress({ cells_done: 0, cells_total: null })).toEqual({
      fraction: null,
      text: 'not started'
    });
    expect(progress({ cells_done: 2, cells_total: 0 }).text).toBe('2 cells done');
    // placed and starting, its cells not counted yet: not "not started" beside "started"
    expect(progress({ cells_done: 0, cells_total: null, state: 'starting' }).text).toBe('starting');
    expect(progress({ cells_done: 0, cells_total: null, state: 'running' }).text).toBe('running');
  });

  it('asks before cancelling, saying what is lost', () => {
    const base = { id: '5', name: 'train', last_checkpoint_at: null };
    expect(cancelQuestion({ ...base, state: 'queued' })).toBe(
      'Cancel "train" (#5)? It leaves the queue; resubmitting it later queues it anew.'
    );
    expect(cancelQuestion({ ...base, state: 'running' })).toBe(
      'Cancel "train" (#5)? It is stopped now, and its work so far is lost.'
    );
    expect(
      cancelQuestion({ ...base, state: 'running', last_checkpoint_at: '2026-01-01T12:00:00Z' })
    ).toBe(
      'Cancel "train" (#5)? It is stopped now, and its work since its last checkpoint is lost.'
    );
  });

  it('describes checkpoint age and lost work', () => {
    const now = Date.parse('2026-01-01T12:10:00Z');
    const running = { state: 'running' };
    expect(checkpointAge({ ...running, last_checkpoint_at: '2026-01-01T12:07:30Z' }, now)).toBe(
      'checkpoint 2m 30s ago'
    );
    expect(checkpointAge({ ...running, last_checkpoint_at: null }, now)).toBe('no checkpoint yet');
    // a finished job, or one that has not started, says nothing about checkpoints
    for (const state of ['completed', 'failed', 'cancelled', 'queued']) {
      expect(checkpointAge({ state, last_checkpoint_at: null }, now)).toBe('');
    }
    expect(lostWork({ restarts: 0, lost_work_seconds: 0 })).toBe('');
    // restarts are the runs after the runner died; preemptions are counted apart
    expect(lostWork({ restarts: 2, preemptions: 0, lost_work_seconds: 95 })).toBe(
      'restarted after a crash twice, 1m 35s of work lost'
    );
    // (a job preempted once used to count a restart too, and read "restarts 1")
    expect(lostWork({ restarts: 0, preemptions: 1, lost_work_seconds: 0 })).toBe(
      'preempted once, 0s of work lost'
    );
    expect(lostWork({ restarts: 1, preemptions: 3, lost_work_seconds: 91.7 })).toBe(
      'preempted 3 times, restarted after a crash once, 1m 31s of work lost'
    );
  });

  it('reports only jobs seen unfinished that are now finished', () => {
    const previous = new Map([
      ['a', 'running'],
      ['b', 'completed'],
      ['c', 'queued']
    ]);
    const now = [
      job({ id: 'a', state: 'completed' }),
      job({ id: 'b', state: 'completed' }),
      job({ id: 'c', state: 'running' }),
      job({ id: 'd', state: 'failed' })
    ];
    expect(newlyFinished(previous, now).map(j => j.id)).toEqual(['a']);
  });

  it('sorts newest first', () => {
    const jobs = [
      job({ id: 'old', submitted_at: '2026-01-01T10:00:00Z' }),
      job({ id: 'new', submitted_at: '2026-01-01T11:00:00Z' })
    ];
    expect(sortJobs(jobs).map(j => j.id)).toEqual(['new', 'old']);
    expect(jobs[0].id).toBe('old');
  });
});

describe('job outputs and events', () => {
  it("opens output.ipynb in a finished job's folder, or a notebook path as is", () => {
    expect(outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'completed' })).toBe(
      'gpu-jobs/train-7/output.ipynb'
    );
    expect(outputNotebook({ output_path: 'gpu-jobs/train-7/', state: 'failed' })).toBe(
      'gpu-jobs/train-7/output.ipynb'
    );
    expect(outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'running' })).toBeNull();
    // cancelled: what the finished cells wrote, if any had finished
    expect(outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'cancelled' })).toBeNull();
    expect(
      outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'cancelled', cells_done: 2 })
    ).toBe('gpu-jobs/train-7/output.ipynb');
    // timed out: killed as a cancelled one is (the button once opened nothing)
    expect(outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'timed-out' })).toBeNull();
    expect(
      outputNotebook({ output_path: 'gpu-jobs/train-7', state: 'timed-out', cells_done: 1 })
    ).toBe('gpu-jobs/train-7/output.ipynb');
    expect(outputNotebook({ output_path: 'out/result.ipynb', state: 'running' })).toBe(
      'out/result.ipynb'
    );
    expect(outputNotebook({ output_path: null, state: 'completed' })).toBeNull();
  });

  it('says when a job was submitted, started and ended, and how long it ran', () => {
    const now = Date.parse('2026-01-01T12:10:00Z');
    const submitted_at = '2026-01-01T12:00:00Z';
    expect(
      jobTimes({ state: 'queued', submitted_at, started_at: null, finished_at: null }, now)
    ).toBe('submitted 10m 00s ago, waited 10m 00s');
    expect(
      jobTimes(
        { state: 'running', submitted_at, started_at: '2026-01-01T12:02:00Z', finished_at: null },
        now
      )
    ).toBe('started 8m 00s ago, running 8m 00s');
    expect(
      jobTimes(
        { state: 'starting', submitted_at, started_at: '2026-01-01T12:09:58Z', finished_at: null },
        now
      )
    ).toBe('placed 2s ago, starting');
    expect(
      jobTimes(
        {
          state: 'completed',
          submitted_at,
          started_at: '2026-01-01T12:02:00Z',
          finished_at: '2026-01-01T12:05:30Z'
        },
        now
      )
    ).toBe('ended 4m 30s ago, ran 3m 30s');
  });

  it('counts time on a GPU, not the wait in the queue between runs', () => {
    const now = Date.parse('2026-01-01T12:10:00Z');
    const first = {
      submitted_at: '2026-01-01T12:00:00Z',
      started_at: '2026-01-01T12:01:00Z',
      finished_at: null
    };
    // preempted after 2 minutes and back in the queue: the wait is not run time
    expect(
      jobTimes({ ...first, state: 'queued', run_seconds: 120, attempt_started_at: null }, now)
    ).toBe('waiting to run again, ran 2m 00s so far');
    // running again for 3 minutes
    expect(
      jobTimes(
        {
          ...first,
          state: 'running',
          run_seconds: 120,
          attempt_started_at: '2026-01-01T12:07:00Z'
        },
        now
      )
    ).toBe('running 3m 00s this run, 5m 00s in all');
    // a first run
    expect(
      jobTimes(
        { ...first, state: 'running', run_seconds: 0, attempt_started_at: first.started_at },
        now
      )
    ).toBe('started 9m 00s ago, running 9m 00s');
    // finished: the runs' total, not the time since the first start
    expect(
      jobTimes(
        {
          ...first,
          state: 'completed',
          finished_at: '2026-01-01T12:09:00Z',
          run_seconds: 300,
          attempt_started_at: null
        },
        now
      )
    ).toBe('ended 1m 00s ago, ran 5m 00s');
  });

  it('says when and why a job was last preempted, and what became of its work', () => {
    const now = Date.parse('2026-01-01T12:10:00Z');
    const transitions = [
      { state: 'running', at: '2026-01-01T12:01:00Z', reason: 'started' },
      {
        state: 'preempting',
        at: '2026-01-01T12:03:00Z',
        reason: "mig-3g.40gb needed by another user's interactive server"
      },
      {
        state: 'preempted',
        at: '2026-01-01T12:04:00Z',
        reason: 'checkpointed and exited; 0s of work to redo'
      },
      { state: 'queued', at: '2026-01-01T12:04:00Z', reason: 'requeued after preemption' }
    ];
    expect(lastPreemption({ state: 'queued', transitions }, now)).toBe(
      "preempted 6m 00s ago: mig-3g.40gb needed by another user's interactive server — checkpointed and exited; 0s of work to redo; requeued"
    );
    // while it is under way: asked, not yet preempted, with the grace left
    const asking = {
      state: 'preempting',
      transitions: transitions.slice(0, 2),
      preempt_deadline: '2026-01-01T12:10:42Z'
    };
    expect(lastPreemption(asking, now)).toBe(
      "asked to checkpoint: mig-3g.40gb needed by another user's interactive server; has up to 42s before it is stopped"
    );
    expect(lastPreemption({ state: 'running', transitions: transitions.slice(0, 1) }, now)).toBe(
      ''
    );
    // it finished inside its grace period: nothing was requeued
    const finished = [
      ...transitions.slice(0, 2),
      { state: 'completed', at: '2026-01-01T12:03:30Z' }
    ];
    expect(lastPreemption({ state: 'completed', transitions: finished }, now)).toBe(
      "preempted 6m 30s ago: mig-3g.40gb needed by another user's interactive server — finished inside its grace period; nothing to requeue"
    );
  });

  it('tells a preemption as it happens: asked, then what came of it (issue 44)', () => {
    const now = Date.parse('2026-01-01T12:03:02Z');
    const asked = {
      state: 'preempting',
      at: '2026-01-01T12:03:00Z',
      reason: 'make room for the workshop (by admin)'
    };
    const base = { id: 7, name: 'train', transitions: [asked] };
    // the announcement no longer says "is preempted; it runs again" while it runs on
    const first = preemptionNews(
      { ...base, state: 'preempting', preempt_deadline: '2026-01-01T12:04:00Z' },
      now,
      140
    );
    expect(first).toEqual({
      key: '7#0:asked',
      type: 'warning',
      message:
        'GPU job train is asked to checkpoint (make room for the workshop (by admin)); it has up to 58s before it is stopped.'
    });
    const killed = {
      state: 'preempted',
      at: '2026-01-01T12:04:16Z',
      reason: 'killed after its 1 min grace period; 1m 31s of work to redo'
    };
    const requeued = { state: 'queued', at: '2026-01-01T12:04:16Z', reason: 'requeued' };
    const after = { ...base, state: 'queued', transitions: [asked, killed, requeued] };
    expect(preemptionNews(after, now, 140)).toEqual({
      key: '7#0:done',
      type: 'info',
      message:
        'GPU job train was preempted: killed after its 1 min grace period; 1m 31s of work to redo; requeued.'
    });
    // one that finished inside its grace: the finished notification says so, once
    const done = { ...base, state: 'completed', transitions: [asked, { state: 'completed' }] };
    expect(preemptionNews(done, now, 140)).toBeNull();
    expect(finishedMessage(done)).toBe('GPU job train completed inside its grace period');
    // (known only from the last poll, where it was still being preempted)
    expect(finishedMessage({ ...base, state: 'completed' })).toBe(
      'GPU job train completed inside its grace period'
    );
    expect(finishedMessage({ ...after, state: 'completed' })).toBe('GPU job train completed');
    expect(preemptionNews({ ...base, state: 'running', transitions: [] }, now, 140)).toBeNull();
    // too long for a notification: without the reason
    const long = preemptionNews({ ...base, state: 'preempting', name: 'x'.repeat(60) }, now, 140);
    expect(long?.message).toBe(
      `GPU job ${'x'.repeat(60)} is asked to checkpoint and give its GPU back; it has its grace period before it is stopped.`
    );
  });

  it('reads the job-finished event and ignores others', () => {
    expect(
      asJobEvent({
        schema_id: 'https://events.gpuslice.dev/jobs/v1',
        job_id: 7,
        name: 'train',
        state: 'failed',
        output_path: 'gpu-jobs/train-7',
        error: 'cell 3 raised'
      })
    ).toEqual({
      job_id: '7',
      name: 'train',
      state: 'failed',
      output_path: 'gpu-jobs/train-7',
      error: 'cell 3 raised'
    });
    expect(
      asJobEvent({ schema_id: 'https://events.gpuslice.dev/idle/v1', job_id: 7, state: 'x' })
    ).toBeNull();
    expect(
      asJobEvent({ schema_id: 'https://events.gpuslice.dev/jobs/v1', state: 'completed' })
    ).toBeNull();
  });

  it('sorts integer ids numerically when submitted together', () => {
    const at = '2026-01-01T12:00:00Z';
    const jobs = [job({ id: 9, submitted_at: at }), job({ id: 10, submitted_at: at })];
    expect(sortJobs(jobs).map(j => j.id)).toEqual([10, 9]);
  });

  it('reports finished jobs with integer ids', () => {
    const previous = new Map([['3', 'running']]);
    expect(newlyFinished(previous, [job({ id: 3, state: 'timed-out' })])).toHaveLength(1);
  });
});
