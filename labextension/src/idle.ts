// Idle warnings: a sticky notification per kernel, driven by the server's idle events.
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';

import type { GpusliceApi } from './api';
import {
  announcementId,
  asIdleEvent,
  idleNotice,
  missedWarnings,
  type IIdleNotice,
  type NoticeType
} from './idleview';
import { refusalMessage } from './refusal';
import { releaseGpu, saveAll } from './release';
import type { IIdleEvent, IStatus } from './types';

export class IdleNotifier {
  private readonly ids = new Map<string, string>();
  /** (kernel, deadline) warnings already shown, from events or from the status. */
  private readonly announced = new Set<string>();

  constructor(
    private readonly app: JupyterFrontEnd,
    private readonly api: GpusliceApi,
    private readonly onChange: () => void,
    private readonly onReleased: () => void = () => undefined
  ) {
    app.serviceManager.events.stream.connect((_, emission) => {
      const event = asIdleEvent(emission as { schema_id?: string });
      if (event) {
        void this.handle(event);
      }
    });
  }

  /** Show warnings the status reports that no event brought to this tab. */
  syncFromStatus(status: IStatus): void {
    for (const event of missedWarnings(status, this.announced)) {
      void this.handle(event);
    }
  }

  async handle(event: IIdleEvent): Promise<void> {
    if (event.action === 'warning' || event.action === 'memory-warning') {
      this.announced.add(announcementId(event.kernel_id, event.deadline));
    }
    const notice = idleNotice(event, Date.now());
    if (notice.saveNotebooks) {
      await saveAll(this.app);
    }
    this.show(
      notice.key,
      notice.type,
      notice.message,
      notice.autoClose,
      this.actions(event, notice)
    );
    this.onChange();
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
    try {
      const reply = await this.api.keepalive(event.kernel_id ? { kernel_id: event.kernel_id } : {});
      const left = reply.extension_left_seconds;
      const extra =
        left !== null && left !== undefined
          ? ` (${Math.floor(left / 60)} min of extensions left)`
          : '';
      this.show(key, 'success', `Keeping your GPU${extra}.`, 5000, []);
    } catch (error) {
      this.show(key, 'error', refusalMessage(error, 'Keeping the GPU'), false, []);
    }
    this.onChange();
  }

  private async release(key: string): Promise<void> {
    this.show(key, 'info', 'Saving notebooks, then releasing the GPU…', false, []);
    const refused = await releaseGpu(this.app, this.api, this.onReleased);
    if (refused) {
      this.show(key, 'error', refused, false, []);
    } else {
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
}
