// Pure logic for idle notifications: what each event from the server means to the user.
import { formatDuration, secondsUntil } from './format';
import { IDLE_SCHEMA_ID, type IIdleEvent, type IStatus, type IdleAction } from './types';

export type NoticeType = 'warning' | 'success' | 'error' | 'info';

export interface IIdleNotice {
  /** Which notification this updates: one per kernel (or the whole server). */
  key: string;
  type: NoticeType;
  message: string;
  /**
   * Buttons: "Keep working" and "Save and release GPU" for a server's idle warning; only
   * "Keep working" for a kernel's (its server keeps the slice: a release would stop the
   * whole server, and every other notebook's running work with it); only the release
   * for a memory warning (a keep-alive does not bring memory under the cap).
   */
  actions: 'keep-or-release' | 'keep' | 'release' | 'none';
  /** Save open notebooks now (a warning may be followed by a cull). */
  saveNotebooks: boolean;
  /** Milliseconds, or false for a sticky notification. */
  autoClose: number | false;
}

const ACTIONS: IdleAction[] = ['warning', 'extended', 'culled', 'memory-warning', 'memory-culled'];

/** The event's data if it is a gpuslice idle event, else null. */
export function asIdleEvent(event: {
  schema_id?: string;
  [key: string]: unknown;
}): IIdleEvent | null {
  if (event.schema_id !== IDLE_SCHEMA_ID) {
    return null;
  }
  const action = event.action as IdleAction;
  if (!ACTIONS.includes(action)) {
    return null;
  }
  const text = (value: unknown): string | null =>
    typeof value === 'string' && value ? value : null;
  return {
    action,
    kernel_id: text(event.kernel_id),
    deadline: text(event.deadline),
    reason: text(event.reason),
    idle_seconds: typeof event.idle_seconds === 'number' ? event.idle_seconds : null
  };
}

export function noticeKey(event: Pick<IIdleEvent, 'kernel_id'>): string {
  return `gpuslice-idle-${event.kernel_id ?? 'server'}`;
}

export function idleNotice(event: IIdleEvent, now: number): IIdleNotice {
  const key = noticeKey(event);
  const left = secondsUntil(event.deadline, now);
  const kernel = event.kernel_id !== null;
  const because = event.reason ? ` (${event.reason})` : '';
  switch (event.action) {
    case 'warning': {
      const idle = event.idle_seconds !== null ? ` for ${formatDuration(event.idle_seconds)}` : '';
      const when = left !== null ? `in ${formatDuration(left)}` : 'soon';
      // A kernel's cull frees the GPU memory it holds; the server keeps its slice. A
      // server's cull gives the slice back to the pool.
      const outcome = kernel
        ? `this kernel will be shut down ${when} to free its GPU memory (this server keeps its GPU slice)`
        : `this server will be stopped ${when} and its GPU slice given back for others`;
      return {
        key,
        type: 'warning',
        message: `Your GPU has been idle${idle}: ${outcome}. Open notebooks were saved.`,
        actions: kernel ? 'keep' : 'keep-or-release',
        saveNotebooks: true,
        autoClose: false
      };
    }
    case 'memory-warning': {
      // The server's reason says what follows (interrupted or shut down, and when); without
      // a deadline nothing does (the memory cap only warns).
      const follows = event.deadline !== null;
      return {
        key,
        type: 'warning',
        message: follows
          ? `GPU memory is over this slice's cap${because}. Open notebooks were saved.`
          : `GPU memory is over this slice's cap${because}. Nothing is stopped, but others on this GPU may run out of memory: please free some.`,
        actions: 'release',
        saveNotebooks: follows,
        autoClose: false
      };
    }
    case 'extended': {
      const until = left !== null ? ` for another ${formatDuration(left)}` : '';
      return {
        key,
        type: 'success',
        message: `Keeping your GPU${until}.`,
        actions: 'none',
        saveNotebooks: false,
        autoClose: 5000
      };
    }
    case 'memory-culled':
      return {
        key,
        type: 'error',
        message: `The kernel went over this slice's GPU memory cap${because}. This server keeps its GPU slice; your saved notebooks are kept.`,
        actions: 'none',
        saveNotebooks: false,
        autoClose: false
      };
    case 'culled':
      return {
        key,
        type: 'error',
        message: kernel
          ? `The kernel was shut down${because || ' (idle)'}, freeing its GPU memory; this server keeps its GPU slice. Your saved notebooks are kept.`
          : `The server was stopped and its GPU slice given back${because || ' (idle)'}. Your saved notebooks are kept.`,
        actions: 'none',
        saveNotebooks: false,
        autoClose: false
      };
  }
}

/**
 * Warnings the status shows that no event announced to this tab (it was opened, or its
 * event stream reconnected, after the warning was sent). Each (kernel, deadline) is
 * returned once: `announced` remembers them, so closing the notification is respected.
 */
export function missedWarnings(
  status: Pick<IStatus, 'kernels' | 'exempt'> & { policy?: IStatus['policy'] },
  announced: Set<string>
): IIdleEvent[] {
  if (status.exempt) {
    return [];
  }
  // Under the "server" action the whole server is warned, once: its kernels carry the
  // server's deadline, and a warning per kernel would say, untruly, that a kernel goes
  // and the server keeps its slice.
  const serverWide = status.policy?.action === 'server';
  const missed: IIdleEvent[] = [];
  for (const kernel of status.kernels) {
    if (!kernel.warning || kernel.exempt || !kernel.deadline) {
      continue;
    }
    const kernelId = serverWide ? null : kernel.id;
    const id = announcementId(kernelId, kernel.deadline);
    if (announced.has(id) || (serverWide && missed.length)) {
      continue;
    }
    announced.add(id);
    missed.push({
      action: 'warning',
      kernel_id: kernelId,
      deadline: kernel.deadline,
      reason: null,
      idle_seconds: kernel.idle_seconds
    });
  }
  return missed;
}

export function announcementId(kernelId: string | null, deadline: string | null): string {
  return `${kernelId ?? 'server'}@${deadline ?? ''}`;
}
