// Idle warnings: a sticky notification per kernel, driven by the server's idle events.
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import type { INotebookTracker } from '@jupyterlab/notebook';

import type { GpusliceApi } from './api';
import { usedLast } from './activetab';
import { formatDuration, secondsUntil } from './format';
import {
  announcementId,
  asIdleEvent,
  idleNotice,
  missedWarnings,
  noticeKey,
  staleWarnings,
  type IIdleNotice,
  type INoticeContext,
  type IShownWarning,
  type NoticeType
} from './idleview';
import { refusalMessage } from './refusal';
import { kernelNotebooks } from './sessions';
import { releasedHere, releaseGpu, saveNotebooks, unsavedNotebooks } from './release';
import type { IIdleEvent, IStatus } from './types';

/**
 * How long before a server's idle deadline this tab saves the open notebooks again: what
 * is typed after the warning (typing is not GPU use) would otherwise go with the server.
 * Never at the cull itself: the server is stopped under a save, and jupyter_server writes
 * a file in place (a save cut short left it empty).
 */
export const SAVE_BEFORE_CULL_MS = 10_000;

export class IdleNotifier {
  private readonly ids = new Map<string, string>();
  /** (kernel, deadline) warnings already shown, from events or from the status. */
  private readonly announced = new Set<string>();
  /** The idle warnings on screen now, by notification key, and when each was shown. */
  private readonly shown = new Map<string, IShownWarning & { at: number }>();
  /** The server's warning: the save planned just before its deadline. */
  private saveTimer: ReturnType<typeof setTimeout> | undefined;
  /** When this tab last saved every open notebook (ms), for the cull's message. */
  private savedAt: number | null = null;

  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly tracker: INotebookTracker | null,
    private readonly api: GpusliceApi,
    private readonly onChange: () => void,
    private readonly onReleased: () => void = () => undefined,
    private readonly onCulled: (reason: string | null) => void = () => undefined
  ) {
    app.serviceManager.events.stream.connect((_, emission) => {
      const event = asIdleEvent(emission as { schema_id?: string });
      if (event) {
        void this.handle(event);
      }
    });
  }

  /**
   * Show warnings the status reports that no event brought to this tab, and take down
   * those it no longer backs. `requestedAt`: when the status was asked for.
   */
  syncFromStatus(status: IStatus, requestedAt: number = Date.now()): void {
    for (const event of missedWarnings(status, this.announced)) {
      void this.handle(event);
    }
    const current = new Map([...this.shown].filter(([, warning]) => warning.at < requestedAt));
    for (const { key, why } of staleWarnings(status, current, Date.now())) {
      this.forget(key);
      if (why === 'resumed') {
        this.show(
          key,
          'success',
          'You are using the GPU again: the idle timer restarted.',
          5000,
          []
        );
      } else {
        this.dismiss(key);
      }
    }
  }

  async handle(event: IIdleEvent): Promise<void> {
    const key = noticeKey(event);
    const context: INoticeContext = { notebook: this.notebookOf(event.kernel_id) };
    if (event.action === 'released') {
      if (releasedHere()) {
        return; // this tab's own release, told by its own dialog
      }
      // Released in another tab: this tab's warnings, and its save planned before the
      // deadline, are over; the server is stopping.
      for (const shown of [...this.shown.keys()]) {
        this.forget(shown);
      }
      for (const other of [...this.ids.keys()].filter(id => id !== key)) {
        this.dismiss(other);
      }
      context.unsaved = unsavedNotebooks(this.tracker).length > 0;
      this.onReleased();
    }
    if (event.action === 'extended' && this.kept.delete(key)) {
      this.onChange(); // this tab's own keep-alive, already confirmed with its reply
      return;
    }
    if (event.action === 'warning' || event.action === 'memory-warning') {
      this.kept.delete(key);
      this.announced.add(announcementId(event.kernel_id, event.deadline));
      if (event.action === 'warning') {
        // (an idle warning only: the status's warning flag and deadline are idleness's, and
        // say nothing of a memory warning, which must not be taken down by them)
        this.shown.set(key, {
          kernelId: event.kernel_id,
          deadline: event.deadline,
          at: Date.now()
        });
        if (event.kernel_id === null) {
          this.planLastSave(event.deadline);
        }
      } else {
        this.forget(key);
      }
    } else {
      this.forget(key);
    }
    if (event.action === 'culled' && event.kernel_id === null) {
      // The server is being stopped: no save now (see SAVE_BEFORE_CULL_MS); say what the
      // last one kept, and whether this tab holds edits made since.
      context.savedAt = this.savedAt;
      context.unsaved = unsavedNotebooks(this.tracker).length > 0;
      context.otherTabSaves = !usedLast();
      this.onCulled(event.reason);
    }
    const notice = idleNotice(event, Date.now(), context);
    // shown first: a save may wait on a question of JupyterLab's ("File Changed")
    this.show(key, notice.type, notice.message, notice.autoClose, this.actions(event, notice));
    this.onChange();
    if (notice.saveNotebooks) {
      await this.save();
    }
  }

  /** Save the open notebooks with unsaved changes (from this tab, if used last). */
  private async save(): Promise<void> {
    if ((await saveNotebooks(this.tracker)) === 'saved') {
      this.savedAt = Date.now(); // (only a save this tab made: the cull's message names it)
    }
  }

  private planLastSave(deadline: string | null): void {
    clearTimeout(this.saveTimer);
    const left = secondsUntil(deadline, Date.now());
    if (left === null) {
      return;
    }
    this.saveTimer = setTimeout(
      () => void this.saveBeforeCull(),
      Math.max(0, left * 1000 - SAVE_BEFORE_CULL_MS)
    );
  }

  /**
   * The planned save, if the server still means to stop: a hidden tab polls nothing and
   * may hold a warning that was taken back (a keep-alive or work in another tab).
   */
  private async saveBeforeCull(): Promise<void> {
    try {
      const status = await this.api.status();
      this.syncFromStatus(status);
    } catch {
      // the server does not answer: nothing can be saved there anyway
      return;
    }
    if (this.shown.has(noticeKey({ kernel_id: null }))) {
      await this.save();
    }
  }

  /** The warning under `key` is over (kept, extended, culled, or no longer true). */
  private forget(key: string): void {
    if (this.shown.delete(key) && key === noticeKey({ kernel_id: null })) {
      clearTimeout(this.saveTimer);
    }
  }

  /** The notebook whose kernel this is, when this lab knows it. */
  private notebookOf(kernelId: string | null): string | null {
    return kernelId ? (kernelNotebooks(this.app).get(kernelId) ?? null) : null;
  }

  private actions(event: IIdleEvent, notice: IIdleNotice): Notification.IAction[] {
    const release: Notification.IAction = {
      label: 'Save and release GPU',
      caption: 'Save open notebooks, then stop this server and give the GPU back',
      displayType: 'warn',
      callback: () => void this.release(notice.key)
    };
    if (notice.actions === 'none') {
      return [];
    }
    if (notice.actions === 'release') {
      return [release];
    }
    const keep: Notification.IAction = {
      label: 'Keep working',
      caption: 'Reset the idle timer and keep the GPU',
      displayType: 'accent',
      callback: () => void this.keepWorking(event, notice.key)
    };
    return notice.actions === 'keep' ? [keep] : [keep, release];
  }

  private async keepWorking(event: IIdleEvent, key: string): Promise<void> {
    // One confirmation: this reply's, with the new deadline; the server's "extended" event
    // for the same keep-alive then finds nothing left to say.
    this.forget(key);
    this.kept.add(key);
    try {
      const reply = await this.api.keepalive(event.kernel_id ? { kernel_id: event.kernel_id } : {});
      const deadlines = reply.kernels
        .filter(kernel => !event.kernel_id || kernel.id === event.kernel_id)
        .map(kernel => secondsUntil(kernel.deadline, Date.now()))
        .filter((left): left is number => left !== null);
      const until = deadlines.length
        ? ` for another ${formatDuration(Math.min(...deadlines))}`
        : '';
      const left = reply.extension_left_seconds;
      const extra =
        left !== null && left !== undefined
          ? ` (${Math.floor(left / 60)} min of extensions left)`
          : '';
      this.show(key, 'success', `Keeping your GPU${until}${extra}.`, 5000, []);
    } catch (error) {
      this.kept.delete(key);
      this.show(key, 'error', refusalMessage(error, 'Keeping the GPU'), false, []);
    }
    this.onChange();
  }

  /** Keys whose keep-alive this tab asked for: their "extended" event is already told. */
  private readonly kept = new Set<string>();

  private async release(key: string): Promise<void> {
    this.show(key, 'info', 'Saving notebooks, then releasing the GPU…', false, []);
    const refused = await releaseGpu(this.tracker, this.api, this.onReleased);
    if (refused) {
      this.show(key, 'error', refused, false, []);
    } else {
      this.forget(key);
      this.show(key, 'info', 'GPU released; this server is stopping.', false, []);
    }
  }

  private show(
    key: string,
    type: NoticeType,
    message: string,
    autoClose: number | false,
    actions: Notification.IAction[]
  ): void {
    const id = this.ids.get(key);
    if (id && Notification.update({ id, message, type, autoClose, actions })) {
      return;
    }
    this.ids.set(key, Notification.emit(message, type, { autoClose, actions }));
  }

  private dismiss(key: string): void {
    const id = this.ids.get(key);
    if (id) {
      Notification.dismiss(id);
      this.ids.delete(key);
    }
  }
}
