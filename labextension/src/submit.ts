// "Submit as GPU job": the dialog (profile with live availability, priority, checkpoint
// interval, max runtime, parameters) and the submission with a clear message for refusals.
import { Dialog, Notification, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import type { GpusliceApi } from './api';
import { formatDuration } from './format';
import { buildSubmitRequest, checkpointPlaceholder, type ISubmitForm } from './params';
import { pollIntervals } from './pollsettings';
import { defaultProfile, profileLabel, refusalMessage } from './refusal';
import { PRIORITIES, type IBurst, type IJob, type IProfile, type ITimeWindow } from './types';

function field(label: string, input: HTMLElement, hint?: string): HTMLLabelElement {
  const row = document.createElement('label');
  row.className = 'jp-gpuslice-field';
  const title = document.createElement('span');
  title.textContent = label;
  row.append(title, input);
  if (hint) {
    const small = document.createElement('small');
    small.textContent = hint;
    row.appendChild(small);
  }
  return row;
}

export class SubmitForm extends Widget implements Dialog.IBodyWidget<ISubmitForm> {
  private readonly profile = document.createElement('select');
  private readonly priority = document.createElement('select');
  private readonly checkpoint = document.createElement('input');
  private readonly runtime = document.createElement('input');
  private readonly parameters = document.createElement('textarea');
  private readonly window = document.createElement('select');
  private readonly windowHint = document.createElement('small');
  private readonly burstable = document.createElement('input');
  private readonly burstHint = document.createElement('small');
  private classWindows: Record<string, string> = {};
  // the longest max runtime the service allows, once it said (the dialog checks it)
  private runtimeLimit: number | null = null;
  private readonly notice = document.createElement('div');
  private timer: number | undefined;

  constructor(
    private readonly api: GpusliceApi,
    private readonly initial: ISubmitForm,
    errors: string[],
    pollMs: number = pollIntervals().profilesMs
  ) {
    super();
    this.addClass('jp-gpuslice-submit');
    const path = document.createElement('div');
    path.className = 'jp-gpuslice-submit-path';
    path.textContent = initial.path;
    this.profile.name = 'profile';
    this.priority.name = 'priority';
    for (const value of PRIORITIES) {
      this.priority.add(new Option(value, value, false, value === initial.priority));
    }
    this.checkpoint.name = 'checkpoint_interval';
    this.checkpoint.value = initial.checkpointInterval;
    this.checkpoint.placeholder = 'empty: the server default';
    this.runtime.name = 'max_runtime';
    this.runtime.value = initial.maxRuntime;
    this.runtime.placeholder = 'empty: the server default';
    this.parameters.name = 'parameters';
    this.parameters.rows = 4;
    this.parameters.value = initial.parameters;
    this.parameters.placeholder = 'learning_rate = 0.01\nepochs = 5';
    this.window.name = 'time_window';
    this.window.add(new Option('any time', '', false, true));
    this.priority.addEventListener('change', () => this.applyClassWindow());
    this.notice.className = 'jp-gpuslice-submit-errors';
    this.notice.setAttribute('role', 'alert');
    this.showErrors(errors);
    // The errors come first: below the fields they were out of sight in a short window.
    this.node.append(
      this.notice,
      path,
      field('GPU profile', this.profile),
      field(
        'Priority',
        this.priority,
        'preemptible jobs run on idle slices and may be paused and resumed'
      ),
      field('Checkpoint interval', this.checkpoint),
      field('Max runtime', this.runtime),
      this.windowField(),
      this.burstField(),
      field('Parameters', this.parameters, 'name = value per line, or a JSON object')
    );
    // What was wrong with the last try no longer applies once the user changes something.
    this.node.addEventListener('input', () => this.showErrors([]));
    this.profile.add(new Option('loading profiles…', ''));
    void this.loadProfiles();
    this.timer = window.setInterval(() => void this.loadProfiles(), pollMs);
  }

  getValue(): ISubmitForm {
    return {
      path: this.initial.path,
      profile: this.profile.value,
      priority: this.priority.value,
      checkpointInterval: this.checkpoint.value,
      maxRuntime: this.runtime.value,
      parameters: this.parameters.value,
      timeWindow: this.window.value,
      burstable: this.burstable.checked,
      maxRuntimeLimit: this.runtimeLimit
    };
  }

  private windowField(): HTMLLabelElement {
    const row = field('Time window', this.window);
    row.appendChild(this.windowHint);
    row.hidden = true; // until the service says which windows there are
    return row;
  }

  private burstField(): HTMLLabelElement {
    this.burstable.type = 'checkbox';
    this.burstable.name = 'burstable';
    this.burstable.checked = this.initial.burstable;
    const row = field('Burst', this.burstable);
    row.appendChild(this.burstHint);
    row.hidden = true; // until the service says it has a burst partition
    return row;
  }

  private showBurst(burst: IBurst | null | undefined): void {
    const row = this.burstable.closest('label');
    row?.toggleAttribute('hidden', !burst);
    if (!burst) {
      this.burstable.checked = false;
      return;
    }
    const high = burst.allocated_above
      ? `, or at once while this cluster is over ${Math.round(burst.allocated_above * 100)}% allocated`
      : '';
    this.burstHint.textContent =
      `may run in the partition ${burst.partition} if it waits ` +
      `${Math.round(burst.after_wait * 100)}% of its max runtime${high}; ` +
      'it resumes there from its checkpoint';
  }

  // A class with a window of its own runs every job in it: the field shows it, fixed.
  private applyClassWindow(): void {
    const forced = this.classWindows[this.priority.value];
    this.window.disabled = Boolean(forced);
    if (forced) {
      this.window.value = forced;
    }
    this.windowHint.textContent = forced
      ? `${this.priority.value} jobs run in this window (set by your administrators)`
      : 'the job waits until the window opens, and is checkpointed and requeued when it closes';
  }

  dispose(): void {
    window.clearInterval(this.timer);
    super.dispose();
  }

  private showErrors(errors: string[]): void {
    this.notice.replaceChildren(
      ...errors.map(text => {
        const line = document.createElement('div');
        line.textContent = text;
        return line;
      })
    );
  }

  private showWindows(windows: ITimeWindow[], classWindows: Record<string, string>): void {
    const chosen = this.window.value || this.initial.timeWindow;
    this.classWindows = classWindows;
    this.window.replaceChildren(
      new Option('any time', '', false, !chosen),
      ...windows.map(w => {
        const state = w.open ? 'open now' : `opens ${new Date(w.opens_at ?? '').toLocaleString()}`;
        return new Option(`${w.name}: ${w.text}, ${state}`, w.name, false, w.name === chosen);
      })
    );
    // no window configured: nothing to choose
    this.window.closest('label')?.toggleAttribute('hidden', !windows.length);
    this.applyClassWindow();
  }

  /**
   * Offer only the priority classes the service lets this user submit (issue 45: any user
   * could ask for `high`); a class the dialog was opened with that is not allowed falls
   * back to the first one allowed. Null: the service said nothing, all are offered.
   */
  private offerPriorities(allowed: string[] | null): void {
    if (allowed === null) {
      return;
    }
    const current = this.priority.value;
    const kept = PRIORITIES.filter(value => allowed.includes(value));
    this.priority.replaceChildren(
      ...kept.map(value => new Option(value, value, false, value === current))
    );
    if (!kept.includes(current as (typeof PRIORITIES)[number]) && kept.length) {
      this.priority.value = kept[0];
    }
    this.applyClassWindow();
  }

  private async loadProfiles(): Promise<void> {
    let profiles: IProfile[];
    let simulated = false;
    try {
      const reply = await this.api.profiles();
      profiles = reply.profiles;
      simulated = reply.simulated;
      if (reply.jobs) {
        // say what an empty field means, in the server's own figures
        const jobs = reply.jobs;
        // (an empty checkpoint interval is the default, but never more than the max runtime:
        // said again as the max runtime is typed)
        const placeholder = () =>
          checkpointPlaceholder(jobs.checkpoint_interval, jobs.max_runtime, this.runtime.value);
        this.checkpoint.placeholder = placeholder();
        this.runtime.addEventListener('input', () => {
          this.checkpoint.placeholder = placeholder();
        });
        this.runtime.placeholder = `empty: ${formatDuration(jobs.max_runtime)} (at most ${formatDuration(jobs.max_runtime_limit)})`;
        this.runtimeLimit = jobs.max_runtime_limit ?? null;
        this.showWindows(jobs.windows ?? [], jobs.class_windows ?? {});
        this.offerPriorities(jobs.allowed_priorities ?? null);
        this.showBurst(jobs.burst);
      }
    } catch (error) {
      this.showErrors([refusalMessage(error, 'Loading GPU profiles')]);
      return;
    }
    if (this.isDisposed) {
      return;
    }
    const chosen = defaultProfile(profiles, this.profile.value || this.initial.profile);
    this.profile.replaceChildren(
      ...profiles.map(p => {
        const option = new Option(profileLabel(p) + (simulated ? ' [simulated]' : ''), p.name);
        option.title = p.description;
        option.selected = p.name === chosen;
        return option;
      })
    );
    if (!profiles.length) {
      this.showErrors(['No GPU profile is offered to you; ask an administrator.']);
    }
  }
}

export const EMPTY_FORM: Omit<ISubmitForm, 'path'> = {
  profile: '',
  priority: 'preemptible',
  checkpointInterval: '',
  maxRuntime: '',
  parameters: '',
  timeWindow: '',
  burstable: false
};

/**
 * Ask for the job's settings until they are valid or the user cancels, then submit.
 * Returns the new job, or null when nothing was submitted.
 */
export async function submitJob(
  api: GpusliceApi,
  path: string,
  onSubmitted: (job: IJob) => void,
  pollMs?: number
): Promise<IJob | null> {
  let form: ISubmitForm = { ...EMPTY_FORM, path };
  let errors: string[] = [];
  for (;;) {
    const result = await showDialog<ISubmitForm>({
      title: 'Submit as GPU job',
      body: new SubmitForm(api, form, errors, pollMs),
      buttons: [Dialog.cancelButton(), Dialog.okButton({ label: 'Submit' })]
    });
    if (!result.button.accept || !result.value) {
      return null;
    }
    form = result.value;
    const built = buildSubmitRequest(form);
    if (!built.ok) {
      errors = built.errors;
      continue;
    }
    try {
      const job = await api.submit(built.value);
      const warnings = job.warnings ?? [];
      if (warnings.length) {
        // e.g. a parameter the notebook sets again: the job computes with another value.
        // Notifications are short: the first warning, the rest are in the job's log.
        const more = warnings.length > 1 ? ` (+${warnings.length - 1} in the job's log)` : '';
        Notification.warning(`Job ${job.id}: ${warnings[0]}${more}`, { autoClose: false });
      } else {
        Notification.success(`Submitted ${job.name || path} as job ${job.id} (${job.state}).`, {
          autoClose: 5000
        });
      }
      onSubmitted(job);
      return job;
    } catch (error) {
      // Keep the dialog's values; the refusal is shown in it (e.g. a quota or a bad profile).
      errors = [refusalMessage(error, 'Submitting the job')];
    }
  }
}
