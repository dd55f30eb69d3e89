// The Jobs panel (left sidebar): the user's batch jobs with live state, progress, logs,
// and actions; notifies when a job it has seen running finishes or is preempted.
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';
import type { Message } from '@lumino/messaging';
import type { ISignal } from '@lumino/signaling';

import type { GpusliceApi } from './api';
import { formatDuration } from './format';
import {
  asJobEvent,
  cancelQuestion,
  checkpointAge,
  isTerminal,
  jobTimes,
  finishedMessage,
  lastPreemption,
  lostWork,
  newlyFinished,
  outputNotebook,
  preemptionNews,
  progress,
  sortJobs,
  stateBadge,
  type IJobEvent
} from './jobview';
import { TOAST_MAX } from './idleview';
import { pollIntervals } from './pollsettings';
import { refusalMessage } from './refusal';
import type { IJob } from './types';

export interface IJobsPanelOptions {
  api: GpusliceApi;
  /** Open a job's output notebook (read-only use: no kernel is started). */
  openOutput: (path: string) => void;
  /** The server's event stream (a "job finished" event arrives before the next poll). */
  events?: ISignal<unknown, { schema_id?: string; [key: string]: unknown }>;
}

function el<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  className: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = document.createElement(tag);
  node.className = className;
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}

/** A job's card, kept across polls: a poll updates its text, not the open log or buttons. */
interface ICard {
  card: HTMLElement;
  info: HTMLElement;
  buttons: HTMLElement;
  /** What the buttons were built for: rebuilt only when it changes (a click must land). */
  buttonsKey: string;
  log: HTMLPreElement | null;
}

export class JobsPanel extends Widget {
  private jobs: IJob[] = [];
  private readonly seen = new Map<string, string>();
  /** The preemption news already told (or known when the job was first seen). */
  private readonly told = new Set<string>();
  private readonly cards = new Map<string, ICard>();
  /** Jobs whose end was already announced (by an event or by a poll), to say it once. */
  private readonly notified = new Set<string>();
  private readonly logs = new Map<string, string>();
  private readonly openLogs = new Set<string>();
  private readonly list = el('div', 'jp-gpuslice-jobs-list');
  private readonly message = el('div', 'jp-gpuslice-jobs-message');
  private timer: number | undefined;
  private loaded = false;
  /** Refresh intervals (ms) while shown and while hidden; set from the settings. */
  pollMs = pollIntervals().jobsMs;
  hiddenPollMs = pollIntervals().jobsHiddenMs;

  constructor(private readonly options: IJobsPanelOptions) {
    super();
    this.id = 'gpuslice-jobs';
    this.addClass('jp-gpuslice-jobs');
    this.title.caption = 'GPU jobs';
    const header = el('div', 'jp-gpuslice-jobs-header');
    header.append(el('h2', '', 'GPU jobs'));
    const refresh = el('button', 'jp-mod-styled jp-gpuslice-refresh', 'Refresh');
    refresh.onclick = () => void this.refresh();
    header.append(refresh);
    this.node.append(header, this.message, this.list);
    options.events?.connect((_, emission) => {
      const event = asJobEvent(emission);
      if (event) {
        this.announce(event);
        void this.refresh();
      }
    });
    void this.refresh();
  }

  /**
   * The server is stopping (its GPU released, or culled idle): poll it no more, say why,
   * and keep the jobs as last seen (they go on without it).
   */
  stopPolling(why: string): void {
    this.stopped = why;
    window.clearTimeout(this.timer);
    this.message.textContent = why;
  }

  private stopped: string | null = null;

  /** Fetch the jobs (and open logs) now, render, and schedule the next poll. */
  async refresh(): Promise<void> {
    window.clearTimeout(this.timer);
    if (this.stopped !== null) {
      return;
    }
    try {
      const jobs = sortJobs(await this.options.api.jobs());
      this.notifyFinished(jobs);
      this.jobs = jobs;
      this.loaded = true;
      this.message.textContent = '';
      await Promise.all([...this.openLogs].map(id => this.fetchLog(id)));
    } catch (error) {
      this.message.textContent = refusalMessage(error, 'Loading jobs');
    }
    if (this.isDisposed || this.stopped !== null) {
      // (stopped while this poll was out: its answer, or its failure, is not news)
      this.message.textContent = this.stopped ?? this.message.textContent;
      return;
    }
    this.render();
    this.schedule();
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    void this.refresh();
  }

  dispose(): void {
    window.clearTimeout(this.timer);
    super.dispose();
  }

  private schedule(): void {
    const active = this.jobs.some(job => !isTerminal(job.state));
    if (this.isVisible) {
      this.timer = window.setTimeout(() => void this.refresh(), this.pollMs);
    } else if (active) {
      // While hidden, poll slowly and only while some job is unfinished, just to notify.
      this.timer = window.setTimeout(() => void this.refresh(), this.hiddenPollMs);
    }
  }

  private notifyFinished(jobs: IJob[]): void {
    // A preemption is told as it happens: asked to checkpoint (and for how long), then
    // what came of it. Only for jobs seen before: opening the panel replays nothing.
    const now = Date.now();
    for (const job of jobs) {
      const news = preemptionNews(job, now, TOAST_MAX);
      if (!news || this.told.has(news.key)) {
        continue;
      }
      this.told.add(news.key);
      if (this.seen.has(String(job.id))) {
        const notify = news.type === 'warning' ? Notification.warning : Notification.info;
        notify(news.message, { autoClose: 10000 });
      }
    }
    for (const job of newlyFinished(this.seen, jobs)) {
      this.announce({
        job_id: String(job.id),
        name: job.name || String(job.id),
        state: job.state,
        output_path: outputNotebook(job),
        error: job.error
      });
    }
    for (const job of jobs) {
      this.seen.set(String(job.id), job.state);
    }
  }

  private announce(event: IJobEvent): void {
    if (this.notified.has(event.job_id)) {
      return;
    }
    this.notified.add(event.job_id);
    // the job as last polled, with its new state: a job that finished while it was being
    // preempted is said to have finished inside its grace period
    const known = this.jobs.find(job => String(job.id) === event.job_id);
    const said = known
      ? finishedMessage({ ...known, state: event.state })
      : `GPU job ${event.name} ${stateBadge(event.state).label}`;
    const output = outputNotebook({ output_path: event.output_path, state: event.state });
    const actions = output
      ? [
          {
            label: 'Open output',
            callback: () => this.options.openOutput(output)
          }
        ]
      : [];
    if (event.state === 'completed') {
      Notification.success(`${said}.`, { autoClose: 10000, actions });
    } else {
      const why = event.error ? `: ${event.error}` : '.';
      Notification.error(`${said}${why}`, {
        autoClose: false,
        actions
      });
    }
  }

  private async fetchLog(id: string): Promise<void> {
    try {
      this.logs.set(id, await this.options.api.log(id));
    } catch (error) {
      this.logs.set(id, refusalMessage(error, 'Loading the log'));
    }
  }

  /** Cancel only once the person confirms: a running job's work is lost with it. */
  private async confirmCancel(job: IJob): Promise<void> {
    const result = await showDialog({
      title: 'Cancel GPU job',
      body: cancelQuestion(job),
      buttons: [
        Dialog.cancelButton({ label: 'Keep it' }),
        Dialog.warnButton({ label: 'Cancel job' })
      ]
    });
    if (result.button.accept) {
      await this.act('Cancelling the job', () => this.options.api.cancel(job.id));
    }
  }

  private async act(doing: string, action: () => Promise<unknown>): Promise<void> {
    try {
      await action();
    } catch (error) {
      Notification.error(refusalMessage(error, doing), { autoClose: false });
    }
    await this.refresh();
  }

  private render(): void {
    if (this.loaded && !this.jobs.length) {
      this.cards.clear();
      this.list.replaceChildren(
        el('p', 'jp-gpuslice-jobs-empty', 'No jobs yet. Use "Submit as GPU job" on a notebook.')
      );
      return;
    }
    const shown = this.jobs.map(job => this.renderJob(job));
    const ids = new Set(this.jobs.map(job => String(job.id)));
    for (const id of [...this.cards.keys()]) {
      if (!ids.has(id)) {
        this.cards.delete(id);
      }
    }
    // Moving a card loses its log's scroll position and any selection: only when the
    // order changed (a new job, one gone).
    const current = [...this.list.children];
    if (current.length !== shown.length || shown.some((card, i) => current[i] !== card)) {
      this.list.replaceChildren(...shown);
    }
  }

  private renderJob(job: IJob): HTMLElement {
    const id = String(job.id);
    let entry = this.cards.get(id);
    if (!entry) {
      const card = el('div', 'jp-gpuslice-job');
      card.dataset.jobId = id;
      const info = el('div', 'jp-gpuslice-job-info');
      const buttons = el('div', 'jp-gpuslice-job-actions');
      card.append(info, buttons);
      entry = { card, info, buttons, buttonsKey: '', log: null };
      this.cards.set(id, entry);
    }
    entry.card.dataset.state = job.state;
    entry.info.replaceChildren(...this.jobInfo(job));
    this.renderButtons(entry, job);
    this.renderLog(entry, job);
    return entry.card;
  }

  /** The card's text: name and state, where and how, progress, times, why it waits. */
  private jobInfo(job: IJob): HTMLElement[] {
    const now = Date.now();
    const badge = stateBadge(job.state);
    const head = el('div', 'jp-gpuslice-job-head');
    head.append(
      el('span', 'jp-gpuslice-job-name', job.name || String(job.id)),
      el('span', `jp-gpuslice-badge jp-gpuslice-badge-${badge.tone}`, badge.label)
    );
    const window = job.time_window ? ` · window ${job.time_window}` : '';
    const burst = job.on_burst ? ' · in the burst partition' : '';
    const parts = [
      head,
      el(
        'div',
        'jp-gpuslice-job-meta',
        `${job.profile} · ${job.priority}${window}${burst} · #${job.id}`
      )
    ];
    const prog = progress(job);
    const bar = el('div', 'jp-gpuslice-progress');
    const fill = el('div', 'jp-gpuslice-progress-fill');
    fill.style.width = `${Math.round((prog.fraction ?? 0) * 100)}%`;
    bar.append(fill);
    parts.push(bar, el('div', 'jp-gpuslice-job-progress', prog.text));

    const details = [jobTimes(job, now), checkpointAge(job, now), lostWork(job)];
    if (job.max_runtime) {
      details.push(`max ${formatDuration(job.max_runtime)}`);
    }
    parts.push(el('div', 'jp-gpuslice-job-details', details.filter(Boolean).join(' · ')));
    const preemption = lastPreemption(job, now);
    if (preemption) {
      parts.push(el('div', 'jp-gpuslice-job-preemption', preemption));
    }
    if (job.waiting_reason && !badge.terminal) {
      parts.push(el('div', 'jp-gpuslice-job-waiting', `waiting: ${job.waiting_reason}`));
    }
    if (job.error) {
      parts.push(el('div', 'jp-gpuslice-job-error', job.error));
    }
    return parts;
  }

  private renderButtons(entry: ICard, job: IJob): void {
    const id = String(job.id);
    const terminal = stateBadge(job.state).terminal;
    const output = outputNotebook(job);
    const key = [this.openLogs.has(id), output, terminal].join('|');
    if (key === entry.buttonsKey) {
      return;
    }
    entry.buttonsKey = key;
    entry.buttons.replaceChildren();
    // (the handlers read the latest job of this id: the buttons outlive a poll)
    const latest = (): IJob => this.jobs.find(j => String(j.id) === id) ?? job;
    const button = (label: string, onClick: () => void): void => {
      const node = el('button', 'jp-mod-styled', label);
      node.onclick = onClick;
      entry.buttons.append(node);
    };
    button(this.openLogs.has(id) ? 'Hide log' : 'Log', () => {
      if (!this.openLogs.delete(id)) {
        this.openLogs.add(id);
      }
      void this.refresh();
    });
    if (output) {
      button('Open output', () => this.options.openOutput(output));
    }
    if (!terminal) {
      button('Cancel', () => void this.confirmCancel(latest()));
    } else {
      button(
        'Resubmit',
        () => void this.act('Resubmitting the job', () => this.options.api.resubmit(job.id))
      );
    }
  }

  /**
   * The open log: its text replaced only when it changed (a selection survives), and
   * kept at the bottom only if it was there (someone reading earlier output stays put).
   */
  private renderLog(entry: ICard, job: IJob): void {
    const id = String(job.id);
    if (!this.openLogs.has(id)) {
      entry.log?.remove();
      entry.log = null;
      return;
    }
    const text = this.logs.get(id) ?? job.log_tail ?? '';
    let log = entry.log;
    if (!log) {
      log = el('pre', 'jp-gpuslice-job-log', text);
      entry.log = log;
      entry.card.append(log);
      const opened = log;
      requestAnimationFrame(() => (opened.scrollTop = opened.scrollHeight));
      return;
    }
    if (log.textContent === text) {
      return;
    }
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.textContent = text;
    if (atBottom) {
      log.scrollTop = log.scrollHeight;
    }
  }
}
