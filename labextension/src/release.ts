// Giving the GPU back on purpose: save, release, then say what happened and how to get a
// GPU again (the server stops with its slice, so the lab is about to lose its server).
import type { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';

import type { GpusliceApi } from './api';
import { usedLast } from './activetab';
import { refusalMessage } from './refusal';

/** Where a person starts a server again: the hub's home page (null outside a hub). */
export function hubHomeUrl(hubPrefix: string | undefined): string | null {
  if (!hubPrefix) {
    return null;
  }
  return hubPrefix.replace(/\/?$/, '/') + 'home';
}

export const RELEASED_TEXT =
  'Your notebooks are saved and this server is stopping; its GPU slice goes back to the pool ' +
  'as it stops. ' +
  'To work on a GPU again, start your server from the hub: it asks which slice you want.';

/**
 * Save the open notebooks that have unsaved changes, one at a time: 'saved', 'left' to
 * another tab, or 'failed' (JupyterLab shows which and why). Only from the tab of this
 * server typed or clicked in last (activetab.ts), and only changed notebooks: another
 * tab's copy must not be written over the one being worked on. And never two at once (a
 * lock of this server's, where the browser has Web Locks): jupyter_server writes a file in
 * place, so two tabs saving together left it half one copy and half the other, not JSON.
 */
export async function saveNotebooks(
  tracker: INotebookTracker | null
): Promise<'saved' | 'left' | 'failed'> {
  if (!usedLast()) {
    return 'left'; // another tab of this server was used since: it saves (activetab.ts)
  }
  const save = async (): Promise<void> => {
    for (const context of unsavedNotebooks(tracker)) {
      await context.save();
    }
  };
  try {
    const locks = (navigator as Navigator & { locks?: LockManager }).locks;
    if (locks) {
      const name = `gpuslice-save:${PageConfig.getBaseUrl()}`;
      await locks.request(name, save);
    } else {
      await save();
    }
    return 'saved';
  } catch (error) {
    console.warn('gpuslice: saving the open notebooks failed', error);
    return 'failed';
  }
}

/** The open notebooks (one context per file) with unsaved changes. */
export function unsavedNotebooks(tracker: INotebookTracker | null): NotebookPanel['context'][] {
  const found = new Map<string, NotebookPanel['context']>();
  tracker?.forEach(panel => {
    const context = panel.context;
    if (context.model.dirty && !context.model.readOnly && !found.has(context.path)) {
      found.set(context.path, context);
    }
  });
  return [...found.values()];
}

let releasing = false;

/** Whether this tab asked for the release (every tab hears of it, this one knows). */
export function releasedHere(): boolean {
  return releasing;
}

/**
 * Save every open notebook, release the slice and tell the person. Resolves to null once
 * released, or to the reason it was not (shown by the caller).
 */
export async function releaseGpu(
  tracker: INotebookTracker | null,
  api: GpusliceApi,
  onReleased: () => void
): Promise<string | null> {
  await saveNotebooks(tracker);
  releasing = true; // (its event may come before the reply)
  try {
    await api.release();
  } catch (error) {
    releasing = false;
    return refusalMessage(error, 'Releasing the GPU');
  }
  onReleased();
  const home = hubHomeUrl(PageConfig.getOption('hubPrefix'));
  void showDialog({
    title: 'GPU released',
    body: RELEASED_TEXT,
    buttons: home
      ? [
          Dialog.cancelButton({ label: 'Stay on this page' }),
          Dialog.okButton({ label: 'Go to the hub' })
        ]
      : [Dialog.okButton({ label: 'OK' })]
  }).then(result => {
    if (home && result.button.accept) {
      window.location.href = home;
    }
  });
  return null;
}

/** The palette command's confirmation: true when the person wants to release. */
export async function confirmRelease(): Promise<boolean> {
  const result = await showDialog({
    title: 'Release the GPU?',
    body:
      'Your open notebooks are saved, this server stops and its GPU slice goes back to the ' +
      'pool for others. Running kernels and unsaved work outside notebooks are lost.',
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: 'Release GPU' })]
  });
  return result.button.accept;
}
