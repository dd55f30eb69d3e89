// Giving the GPU back on purpose: save, release, then say what happened and how to get a
// GPU again (the server stops with its slice, so the lab is about to lose its server).
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';

import type { GpusliceApi } from './api';
import { refusalMessage } from './refusal';

export const SAVE_ALL = 'docmanager:save-all';

/** Where a person starts a server again: the hub's home page (null outside a hub). */
export function hubHomeUrl(hubPrefix: string | undefined): string | null {
  if (!hubPrefix) {
    return null;
  }
  return hubPrefix.replace(/\/?$/, '/') + 'home';
}

export const RELEASED_TEXT =
  'Your notebooks are saved and the GPU slice is back in the pool; this server is stopping. ' +
  'To work on a GPU again, start your server from the hub: it asks which slice you want.';

/** Save every open document; false when a save failed (the lab shows which and why). */
export async function saveAll(app: JupyterFrontEnd): Promise<boolean> {
  if (!app.commands.hasCommand(SAVE_ALL)) {
    return false;
  }
  try {
    await app.commands.execute(SAVE_ALL);
    return true;
  } catch (error) {
    console.warn('gpuslice: saving the open notebooks failed', error);
    return false;
  }
}

/**
 * Save every open notebook, release the slice and tell the person. Resolves to null once
 * released, or to the reason it was not (shown by the caller).
 */
export async function releaseGpu(
  app: JupyterFrontEnd,
  api: GpusliceApi,
  onReleased: () => void
): Promise<string | null> {
  await saveAll(app);
  try {
    await api.release();
  } catch (error) {
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
