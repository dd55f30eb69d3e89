// gpuslice in JupyterLab: status bar item, idle warnings, "Submit as GPU job", Jobs panel.
import {
  ConnectionLost,
  IConnectionLost,
  JupyterFrontEnd,
  JupyterLab,
  type JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  IToolbarWidgetRegistry,
  Notification,
  showDialog
} from '@jupyterlab/apputils';
import { IDefaultFileBrowser } from '@jupyterlab/filebrowser';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { INotebookTracker, type NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon, ToolbarButton } from '@jupyterlab/ui-components';

import { watchUse } from './activetab';
import { createApi } from './connection';
import { IdleNotifier } from './idle';
import { JobsPanel } from './jobspanel';
import { confirmRelease, releaseGpu } from './release';
import { pollIntervals } from './pollsettings';
import { kernelNotebooks } from './sessions';
import { GpuStatusItem } from './statusbar';
import { markStopping, stoppingReason } from './stopping';
import { submitJob } from './submit';

export const SUBMIT_COMMAND = 'gpuslice:submit-job';
export const JOBS_COMMAND = 'gpuslice:show-jobs';
export const RELEASE_COMMAND = 'gpuslice:release-gpu';

const gpuIcon = new LabIcon({
  name: 'gpuslice:gpu',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24" width="16"><g class="jp-icon3" fill="#616161">' +
    '<path d="M3 7h15v10H3zM5 9v6h11V9zm14 1h2v4h-2zM6 18h2v2H6zm4 0h2v2h-2zm4 0h2v2h-2z"/>' +
    '<circle cx="10.5" cy="12" r="2"/></g></svg>'
});

/** The notebook the command acts on: the file browser item right-clicked, else the open one. */
function targetPath(
  app: JupyterFrontEnd,
  args: Record<string, unknown>,
  tracker: INotebookTracker | null,
  browser: IDefaultFileBrowser | null
): string {
  if (typeof args.path === 'string' && args.path) {
    return args.path;
  }
  if (browser && app.contextMenuHitTest(node => node.classList.contains('jp-DirListing-item'))) {
    const item = browser.selectedItems().next();
    if (item && !item.done && item.value) {
      return item.value.path;
    }
  }
  return tracker?.currentWidget?.context.path ?? '';
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpuslice-labextension:plugin',
  description: 'GPU slice status, idle warnings and batch jobs for gpuslice',
  autoStart: true,
  optional: [
    IStatusBar,
    ICommandPalette,
    INotebookTracker,
    IDefaultFileBrowser,
    IToolbarWidgetRegistry,
    ISettingRegistry
  ],
  activate: (
    app: JupyterFrontEnd,
    statusBar: IStatusBar | null,
    palette: ICommandPalette | null,
    tracker: INotebookTracker | null,
    browser: IDefaultFileBrowser | null,
    toolbars: IToolbarWidgetRegistry | null,
    settingRegistry: ISettingRegistry | null
  ) => {
    const api = createApi(app.serviceManager.serverSettings);
    watchUse(); // which of this server's tabs saves for the idle warnings (activetab.ts)

    let status: GpuStatusItem | null = null;
    let panel: JobsPanel | null = null;
    // The server is stopping with its slice (released here or in another tab, or culled
    // idle): the lab has said so, and polls nothing more of it.
    const released = (): void => {
      markStopping('released');
      status?.released();
      panel?.stopPolling(STOPPING_TEXT);
    };
    const culled = (reason: string | null): void => {
      markStopping('culled');
      status?.culled(reason);
      panel?.stopPolling(STOPPING_TEXT);
    };
    const notifier = new IdleNotifier(
      app,
      tracker,
      api,
      () => void status?.refresh(),
      released,
      culled
    );
    if (statusBar) {
      status = new GpuStatusItem(
        api,
        (current, requestedAt) => notifier.syncFromStatus(current, requestedAt),
        () => kernelNotebooks(app)
      );
      statusBar.registerStatusItem('gpuslice:status', {
        item: status,
        align: 'left',
        rank: 5
      });
    }

    // A job's output is for reading: no kernel on this server's GPU slice until the person
    // picks one. (A JupyterLab whose docmanager:open has no kernelPreference ignores it and
    // starts one, as for any notebook.) The tab keeps the file's name: a document's tab
    // label is its file name in JupyterLab 4, and setting it renames the file.
    const openOutput = (path: string): void => {
      void app.commands.execute('docmanager:open', {
        path,
        kernelPreference: { shouldStart: false, autoStartDefault: false }
      });
    };
    const jobs = new JobsPanel({
      api,
      openOutput,
      events: app.serviceManager.events.stream
    });
    panel = jobs;
    jobs.title.icon = gpuIcon;
    app.shell.add(jobs, 'left', { rank: 600 });

    // Poll intervals: the schema's defaults until the settings load, then the user's.
    let intervals = pollIntervals();
    const applySettings = (settings: ISettingRegistry.ISettings): void => {
      intervals = pollIntervals(settings.composite as Record<string, unknown>);
      if (status) {
        status.pollInterval = intervals.statusMs;
      }
      jobs.pollMs = intervals.jobsMs;
      jobs.hiddenPollMs = intervals.jobsHiddenMs;
    };
    settingRegistry
      ?.load(plugin.id)
      .then(settings => {
        applySettings(settings);
        settings.changed.connect(applySettings);
      })
      .catch(reason => console.warn('gpuslice: settings not loaded, using defaults', reason));

    app.commands.addCommand(JOBS_COMMAND, {
      label: 'Show GPU jobs',
      execute: () => app.shell.activateById(jobs.id)
    });
    app.commands.addCommand(SUBMIT_COMMAND, {
      label: 'Submit as GPU job…',
      caption: 'Run this notebook as a batch job on a GPU slice',
      icon: gpuIcon,
      execute: async args => {
        const path = targetPath(app, args, tracker, browser);
        if (!path.endsWith('.ipynb')) {
          Notification.warning('Open or select a notebook (.ipynb) to submit it as a GPU job.', {
            autoClose: 5000
          });
          return;
        }
        // The job runs the saved file: save the open copy first so it runs what the user sees.
        const open = tracker?.find(widget => widget.context.path === path);
        if (open?.context.model.dirty) {
          await open.context.save();
        }
        await submitJob(
          api,
          path,
          () => {
            app.shell.activateById(jobs.id);
            void jobs.refresh();
          },
          intervals.profilesMs
        );
      }
    });
    // The notebook toolbar's button submits the notebook it belongs to, not whichever one
    // the lab considers current (they differ after restored tabs or in split views).
    toolbars?.addFactory<NotebookPanel>(
      'Notebook',
      'gpuslice-submit',
      notebook =>
        new ToolbarButton({
          icon: gpuIcon,
          tooltip: 'Submit as GPU job…',
          onClick: () => void app.commands.execute(SUBMIT_COMMAND, { path: notebook.context.path })
        })
    );
    app.commands.addCommand(RELEASE_COMMAND, {
      label: 'Release GPU (save notebooks and stop this server)',
      caption: "Give this server's GPU slice back to the pool",
      execute: async () => {
        if (!(await confirmRelease())) {
          return;
        }
        const refused = await releaseGpu(tracker, api, released);
        if (refused) {
          Notification.error(refused, { autoClose: false });
        }
      }
    });
    palette?.addItem({ command: SUBMIT_COMMAND, category: 'GPU' });
    palette?.addItem({ command: RELEASE_COMMAND, category: 'GPU' });
    palette?.addItem({ command: JOBS_COMMAND, category: 'GPU' });
  }
};

const STOPPING_TEXT =
  'This server is stopping with its GPU slice. Your GPU jobs go on: start your server from ' +
  'the hub to follow them here.';

/**
 * What the lab does when it loses its server. Where gpuslice stopped the server on purpose
 * (released, culled idle) the person has been told why, and JupyterLab's "Server
 * unavailable or unreachable" dialog would only contradict it (issue 44): nothing more is
 * said. Otherwise it is the hub extension's dialog, which offers to restart the server
 * (this plugin replaces @jupyterlab/hub-extension:connectionlost, disabled in
 * package.json), or JupyterLab's own outside a hub.
 */
const connectionLost: JupyterFrontEndPlugin<IConnectionLost> = {
  id: 'gpuslice-labextension:connection-lost',
  description: 'Says nothing more of a server gpuslice stopped on purpose',
  autoStart: true,
  requires: [JupyterFrontEnd.IPaths],
  optional: [JupyterLab.IInfo],
  provides: IConnectionLost,
  activate: (
    app: JupyterFrontEnd,
    paths: JupyterFrontEnd.IPaths,
    info: JupyterLab.IInfo | null
  ): IConnectionLost => {
    const hubPrefix = paths.urls.hubPrefix || '';
    let showing = false;
    return async (manager, error, translator) => {
      if (stoppingReason() !== null) {
        return;
      }
      if (!hubPrefix) {
        return ConnectionLost(manager, error, translator);
      }
      if (showing) {
        return;
      }
      showing = true;
      if (info) {
        info.isConnected = false;
      }
      const result = await showDialog({
        title: 'Server unavailable or unreachable',
        body: `Your server at ${paths.urls.base} is not running.\nWould you like to restart it?`,
        buttons: [Dialog.okButton({ label: 'Restart' }), Dialog.cancelButton({ label: 'Dismiss' })]
      });
      if (info) {
        info.isConnected = true;
      }
      showing = false;
      if (result.button.accept) {
        await app.commands.execute('hub:restart');
      }
    };
  }
};

export default [plugin, connectionLost];
