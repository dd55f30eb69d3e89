// The status bar item: this server's slice, live GPU use of its kernels, idle countdown.
import { Widget } from '@lumino/widgets';

import { ApiError, type GpusliceApi } from './api';
import { documentVisibility, VisiblePoller } from './poller';
import { pollIntervals } from './pollsettings';
import { statusView } from './statusview';
import type { IStatus } from './types';

export class GpuStatusItem extends Widget {
  private status: IStatus | null = null;
  private fetchedAt = 0;
  private readonly poller: VisiblePoller;
  private tickTimer: number | undefined;
  private readonly label: HTMLSpanElement;

  constructor(
    private readonly api: GpusliceApi,
    private readonly onStatus: (status: IStatus, requestedAt: number) => void = () => undefined,
    private readonly notebooks: () => ReadonlyMap<string, string> = () => new Map()
  ) {
    super();
    this.addClass('jp-gpuslice-status');
    this.label = document.createElement('span');
    this.label.className = 'jp-gpuslice-status-text';
    this.node.appendChild(this.label);
    this.label.textContent = 'GPU …';
    // Only while the tab is on screen (see poller.ts); the events stream still brings
    // warnings to a hidden tab.
    this.poller = new VisiblePoller(
      () => void this.refresh(),
      pollIntervals().statusMs,
      documentVisibility
    );
    this.poller.start();
    // The countdown ticks every second between polls, from the last answer's deadlines.
    this.tickTimer = window.setInterval(() => this.render(), 1000);
  }

  /** How often to poll while the tab is on screen (from the settings). */
  set pollInterval(ms: number) {
    this.poller.interval = ms;
  }

  /** Poll now (after a keep-alive, the deadline moved). */
  async refresh(): Promise<void> {
    if (this.isDisposed || this.stopped) {
      return;
    }
    const requestedAt = Date.now();
    try {
      const status = await this.api.status();
      if (this.stopped) {
        return; // the server went (released or culled) while this poll was out
      }
      this.status = status;
      this.fetchedAt = Date.now();
      this.render();
      this.onStatus(status, requestedAt);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        // No gpuslice server extension here: nothing to show, and no point polling.
        this.stop();
        this.hide();
        return;
      }
      if (this.stopped) {
        return;
      }
      // (and no countdown from the last answer: the tick would paint it again)
      this.status = null;
      this.removeClass('jp-gpuslice-status-warning');
      this.label.textContent = 'GPU ?';
      this.node.title = `GPU status unavailable: ${(error as Error).message}`;
    }
  }

  /** The slice was given back and the server is stopping: nothing more to poll or count. */
  released(): void {
    this.stopWith(
      'GPU released',
      'This server gave its GPU slice back and is stopping. Start your server from the hub ' +
        'to get a GPU again.'
    );
  }

  /** The server was culled for idleness: say so, and poll no more (it is going away). */
  culled(reason: string | null): void {
    this.stopWith(
      'GPU released (idle)',
      `This server was stopped because its GPU was idle${reason ? ` (${reason})` : ''}, and ` +
        'its GPU slice given back. Start your server from the hub to get a GPU again.'
    );
  }

  private stopWith(text: string, title: string): void {
    this.stop();
    this.status = null;
    this.label.textContent = text;
    this.node.title = title;
    this.removeClass('jp-gpuslice-status-warning');
  }

  private render(): void {
    if (!this.status) {
      return;
    }
    const view = statusView(this.status, Date.now(), this.notebooks());
    this.label.textContent = view.text;
    this.node.title =
      view.title + `\nupdated ${Math.round((Date.now() - this.fetchedAt) / 1000)}s ago`;
    this.toggleClass('jp-gpuslice-status-warning', view.countdown !== null);
    this.toggleClass('jp-gpuslice-status-simulated', view.simulated);
  }

  private stopped = false;

  private stop(): void {
    this.stopped = true;
    this.poller.stop();
    window.clearInterval(this.tickTimer);
  }

  dispose(): void {
    this.stop();
    super.dispose();
  }
}
