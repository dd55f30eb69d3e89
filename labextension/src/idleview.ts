// Pure logic for idle notifications: what each event from the server means to the user.
import { formatClock, formatDuration, secondsUntil } from './format';
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

/** What this tab knows beyond the event itself. */
export interface INoticeContext {
  /** The notebook whose kernel the event is about (from the lab's sessions). */
  notebook?: string | null;
  /**
   * A server's cull: when this tab last saved the open notebooks (ms since the epoch),
   * and whether it holds edits made since (they went with the server).
   */
  savedAt?: number | null;
  unsaved?: boolean;
  /** Another tab of this server, the one used last, does the saving (activetab.ts). */
  otherTabSaves?: boolean;
}

/**
 * JupyterLab cuts a notification's message at 140 characters (the rest shows as "…"): every
 * message here fits, with a notebook name of up to NAME_MAX characters.
 */
export const TOAST_MAX = 140;
export const NAME_MAX = 20;

/** A notebook's file name, shortened in the middle to fit a toast. */
export function shortName(path: string): string {
  const name = path.split('/').pop() || path;
  if (name.length <= NAME_MAX) {
    return name;
  }
  const keep = NAME_MAX - 1;
  return `${name.slice(0, Math.ceil(keep / 2))}…${name.slice(name.length - Math.floor(keep / 2))}`;
}

/** "the kernel of analysis.ipynb", or "this kernel" when the tab does not know it. */
function kernelName(context: INoticeContext): string {
  return context.notebook ? `the kernel of ${shortName(context.notebook)}` : 'this kernel';
}

function capitalized(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** The memory cap's reason ("kernel uses 5324 MiB of GPU memory, …") about `which`. */
function memoryText(which: string, reason: string | null): string {
  const what = reason
    ? reason.replace(/^kernel /, '')
    : "uses more GPU memory than this slice's cap";
  return `${capitalized(which)} ${what}.`;
}

/** What a person reads about their notebooks once the server has been stopped. */
function afterServerCull(context: INoticeContext): string {
  if (context.otherTabSaves) {
    return ' Saving was left to the tab used last.';
  }
  const at = context.savedAt ? formatClock(context.savedAt) : null;
  if (context.unsaved) {
    return at
      ? ` Edits after ${at} were not saved: copy them from this page.`
      : ' Unsaved edits were not saved: copy them from this page.';
  }
  return at ? ` Notebooks saved at ${at}.` : ' Saved notebooks are kept.';
}

const ACTIONS: IdleAction[] = [
  'warning',
  'extended',
  'culled',
  'memory-warning',
  'memory-culled',
  'released'
];

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

export function idleNotice(
  event: IIdleEvent,
  now: number,
  context: INoticeContext = {}
): IIdleNotice {
  const key = noticeKey(event);
  const left = secondsUntil(event.deadline, now);
  const kernel = event.kernel_id !== null;
  const which = kernelName(context);
  switch (event.action) {
    case 'warning': {
      const idle = event.idle_seconds !== null ? ` for ${formatDuration(event.idle_seconds)}` : '';
      const when = left !== null ? `in ${formatDuration(left)}` : 'soon';
      // Whose idleness it is: under the kernel action one kernel may sit idle while another
      // keeps the GPU busy, so "your GPU is idle" would be untrue.
      // A kernel's cull frees the GPU memory it holds; the server keeps its slice. A
      // server's cull gives the slice back, and takes what was typed since the last save
      // with it: this tab saves again just before the deadline (IdleNotifier), and says so.
      const message = kernel
        ? `${capitalized(which)}, idle on the GPU${idle}, stops ${when} and loses its variables; the slice stays. Notebooks saved.`
        : `This server, idle on the GPU${idle}, stops ${when} and its slice goes back to the pool. Notebooks saved, and again just before.`;
      return {
        key,
        type: 'warning',
        message,
        // a kernel's warning offers the release too: the whole server's slice goes back
        actions: 'keep-or-release',
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
        message:
          memoryText(which, event.reason) +
          (follows
            ? ' Notebooks saved.'
            : ' Nothing is stopped; others on this GPU may run short.'),
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
        message: memoryText(which, event.reason) + ' The slice stays.',
        actions: 'none',
        saveNotebooks: false,
        autoClose: false
      };
    case 'culled':
      return {
        key,
        type: 'error',
        message: kernel
          ? `${capitalized(which)} was shut down, idle on the GPU: its variables are gone (run the notebook again). The slice stays.`
          : 'Server stopped, idle on the GPU; its slice went back to the pool.' +
            afterServerCull(context),
        actions: 'none',
        saveNotebooks: false,
        autoClose: false
      };
    case 'released':
      // Only another tab hears of it this way (the tab that released says so itself). It
      // saves nothing now: the server is being stopped, and a save cut short empties the
      // file; its own edits since its last save go with the server.
      return {
        key,
        type: 'info',
        message:
          'GPU released in another tab; this server is stopping.' +
          (context.unsaved
            ? ' Unsaved edits here were not saved: copy them from this page.'
            : ' Nothing here was left unsaved.'),
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

/** A warning this tab shows: whose (a kernel's id, or null: the server's) and its deadline. */
export interface IShownWarning {
  kernelId: string | null;
  deadline: string | null;
}

/**
 * Shown warnings that a status no longer backs, with why: `resumed` (the kernel, or under
 * the server action every kernel, is no longer warned and its deadline moved on: it was
 * used or kept alive, even if that is only seen after the old deadline) or `gone` (the
 * kernel was shut down by its owner before its deadline). A kernel past its deadline that
 * is gone, or not yet moved on, is left to the cull's own event. The status must have been
 * asked for after the warning was shown (an earlier one predates it).
 */
export function staleWarnings(
  status: Pick<IStatus, 'kernels' | 'exempt'>,
  shown: ReadonlyMap<string, IShownWarning>,
  now: number
): { key: string; why: 'resumed' | 'gone' }[] {
  const stale: { key: string; why: 'resumed' | 'gone' }[] = [];
  for (const [key, warning] of shown) {
    const left = secondsUntil(warning.deadline, now);
    // (a kernel being culled is not warned either, but its deadline stays where it was)
    const movedOn = (kernel: IStatus['kernels'][number]) =>
      !kernel.warning &&
      (kernel.deadline === null ||
        (Date.parse(kernel.deadline) || 0) > (Date.parse(warning.deadline ?? '') || 0) + 1000);
    if (warning.kernelId === null) {
      // the server's warning: its kernels carry it; without kernels the status cannot say
      if (status.kernels.length && status.kernels.every(movedOn)) {
        stale.push({ key, why: 'resumed' });
      }
      continue;
    }
    const kernel = status.kernels.find(k => k.id === warning.kernelId);
    if (!kernel) {
      if (left === null || left > 0) {
        stale.push({ key, why: 'gone' });
      }
    } else if (movedOn(kernel)) {
      stale.push({ key, why: 'resumed' });
    }
  }
  return stale;
}
