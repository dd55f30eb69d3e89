// Polling that stops while the tab is hidden. A forgotten tab must not look like a person:
// JupyterHub's proxy records every request as activity, so a poll from a tab nobody looks
// at would keep the server (and its GPU) from jupyterhub-idle-culler.

export interface IVisibility {
  /** Whether the page is on screen now. */
  visible(): boolean;
  /** Call `listener` whenever visibility changes; returns the unsubscribe function. */
  onChange(listener: () => void): () => void;
}

/** The browser's page visibility. */
export const documentVisibility: IVisibility = {
  visible: () => document.visibilityState !== 'hidden',
  onChange: listener => {
    document.addEventListener('visibilitychange', listener);
    return () => document.removeEventListener('visibilitychange', listener);
  }
};

export class VisiblePoller {
  private timer: ReturnType<typeof setInterval> | undefined;
  private unsubscribe: (() => void) | undefined;
  private stopped = false;

  constructor(
    private readonly poll: () => void,
    private intervalMs: number,
    private readonly visibility: IVisibility
  ) {}

  /** Poll now (when visible) and every interval while visible. */
  start(): void {
    this.unsubscribe = this.visibility.onChange(() => this.sync(true));
    this.sync(true);
  }

  stop(): void {
    this.stopped = true;
    this.clear();
    this.unsubscribe?.();
  }

  /** A new interval (the settings changed): takes effect at once, without an extra poll. */
  set interval(ms: number) {
    if (ms === this.intervalMs) {
      return;
    }
    this.intervalMs = ms;
    this.clear();
    this.sync(false);
  }

  get running(): boolean {
    return this.timer !== undefined;
  }

  private sync(pollNow: boolean): void {
    if (this.stopped) {
      return;
    }
    if (!this.visibility.visible()) {
      this.clear();
      return;
    }
    if (pollNow) {
      this.poll(); // back on screen: fresh figures at once, not up to an interval late
    }
    if (this.timer === undefined) {
      this.timer = setInterval(() => this.poll(), this.intervalMs);
    }
  }

  private clear(): void {
    if (this.timer !== undefined) {
      clearInterval(this.timer);
      this.timer = undefined;
    }
  }
}
