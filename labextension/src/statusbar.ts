// The status bar item: this server's slice, live GPU use of its kernels, idle countdown.
import { Widget } from '@lumino/widgets';

import { ApiError, type GpusliceApi } from './api';
import { statusView } from './statusview';
import type { IStatus } from './types';

const POLL_MS = 5000;

export class GpuStatusItem extends Widget {
  private status: IStatus | null = null;
  private fetchedAt = 0;
  private pollTimer: number | undefined;
  private tickTimer: number | undefined;
  private readonly label: HTMLSpanElement;

  constructor(
    private readonly api: GpusliceApi,
    private readonly onStatus: (status: IStatus) => void = () => undefined
  ) {
    super();
    this.addClass('jp-gpuslice-status');
    this.label = document.createElement('span');
    this.label.className = 'jp-gpuslice-status-text';
    this.node.appendChild(this.label);
    this.label.textContent = 'GPU …';
    void this.refresh();
    this.pollTimer = window.setInterval(() => void this.refresh(), POLL_MS);
    // The countdown ticks every second between polls, from the last answer's deadlines.
    this.tickTimer = window.setInterval(() => this.render(), 1000);
  }

  /** Poll now (after a keep-alive, the deadline moved). */
  async refresh(): Promise<void> {
    try {
      this.status = await this.api.status();
      this.fetchedAt = Date.now();
      this.render();
      this.onStatus(this.status);
    } catch (error) {
      if (error instanceof ApiError && error.status === 404) {
        // No gpuslice server extension here: nothing to show, and no point polling.
        this.stop();
        this.hide();
        return;
      }
      this.label.textContent = 'GPU ?';
      this.node.title = `GPU status unavailable: ${(error as Error).message}`;
    }
  }

  private render(): void {
    if (!this.status) {
      return;
    }
    const view = statusView(this.status, Date.now());
    this.label.textContent = view.text;
    this.node.title =
      view.title + `\nupdated ${Math.round((Date.now() - this.fetchedAt) / 1000)}s ago`;
    this.toggleClass('jp-gpuslice-status-warning', view.countdown !== null);
    this.toggleClass('jp-gpuslice-status-simulated', view.simulated);
  }

  private stop(): void {
    window.clearInterval(this.pollTimer);
    window.clearInterval(this.tickTimer);
  }

  dispose(): void {
    this.stop();
    super.dispose();
  }
}
