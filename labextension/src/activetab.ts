// Which of a server's open lab tabs saves for the idle warnings: the one the person used
// last. Every tab whose kernel has started holds a changed copy (JupyterLab records the
// kernel's language in the notebook), so "only changed notebooks" alone would still let a
// forgotten tab write its copy over the one being worked on.
import { PageConfig } from '@jupyterlab/coreutils';

const KEY = `gpuslice-active-tab:${PageConfig.getBaseUrl()}`;
const ME = `${Date.now()}-${Math.random().toString(36).slice(2)}`;

function read(): string | null {
  try {
    return window.localStorage.getItem(KEY);
  } catch {
    return null; // no storage (a private window's settings): every tab counts as used
  }
}

/** This tab is the one used last (a key or a click in it: looking at a tab is not use). */
export function markUsed(): void {
  try {
    window.localStorage.setItem(KEY, ME);
  } catch {
    // as above
  }
}

/** Whether this tab was the one used last among this server's tabs (or nothing says). */
export function usedLast(): boolean {
  const last = read();
  return last === null || last === ME;
}

/**
 * Follow this tab's use from now on. Typing or clicking marks it; opening, focusing or
 * showing a tab does not (a glance at another tab must not leave the edits made in this
 * one unsaved). Before any tab was used, every tab saves.
 */
export function watchUse(): void {
  for (const event of ['keydown', 'pointerdown']) {
    window.addEventListener(event, markUsed, { capture: true, passive: true });
  }
  // a closed tab saves nothing: the others count as used again
  window.addEventListener('pagehide', () => {
    try {
      if (read() === ME) {
        window.localStorage.removeItem(KEY);
      }
    } catch {
      // as above
    }
  });
}
