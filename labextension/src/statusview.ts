// Pure logic for the status bar item: one short line and a longer tooltip from /status.
import { formatCountdown, formatMemory, formatPercent, secondsUntil } from './format';
import type { IKernelActivity, IStatus } from './types';

export interface IStatusView {
  text: string;
  title: string;
  /** Seconds to the nearest idle deadline when it is near enough to show, else null. */
  countdown: number | null;
  simulated: boolean;
}

/** The kernel whose idle deadline comes first (exempt kernels never get culled). */
export function nearestDeadline(
  kernels: IKernelActivity[],
  now: number
): { kernel: IKernelActivity; seconds: number } | null {
  let best: { kernel: IKernelActivity; seconds: number } | null = null;
  for (const kernel of kernels) {
    if (kernel.exempt) {
      continue;
    }
    const seconds = secondsUntil(kernel.deadline, now);
    if (seconds !== null && (best === null || seconds < best.seconds)) {
      best = { kernel, seconds };
    }
  }
  return best;
}

function memoryText(used: number | null | undefined, cap: number | null | undefined): string {
  return cap ? `${formatMemory(used ?? 0)} / ${formatMemory(cap)}` : formatMemory(used);
}

export function statusView(status: IStatus, now: number): IStatusView {
  const slice = status.slice;
  if (!slice) {
    return {
      text: 'GPU: none',
      title: 'This server holds no GPU slice.',
      countdown: null,
      simulated: false
    };
  }
  const server = status.server ?? { utilization: null, memory_mib: null };
  const parts = [
    `GPU ${slice.profile}`,
    formatPercent(server.utilization),
    memoryText(server.memory_mib, slice.memory_cap_mib)
  ];
  // A server-wide policy has one deadline for the whole server; treat it like a kernel's.
  const candidates = server.deadline
    ? [
        ...status.kernels,
        {
          id: '',
          name: 'server',
          execution_state: '',
          utilization: server.utilization,
          memory_mib: server.memory_mib,
          idle_seconds: null,
          deadline: server.deadline,
          warning: false,
          exempt: false
        }
      ]
    : status.kernels;
  const nearest = status.exempt ? null : nearestDeadline(candidates, now);
  const lead = status.policy?.warning_lead ?? null;
  const near =
    nearest !== null && (nearest.kernel.warning || lead === null || nearest.seconds <= lead);
  if (near && nearest) {
    parts.push(`idle ${formatCountdown(nearest.seconds)}`);
  }
  const title = [
    `Slice: ${slice.profile} (${slice.kind}${slice.simulated ? ', SIMULATED GPU' : ''})`,
    slice.memory_cap_mib ? `Memory cap: ${formatMemory(slice.memory_cap_mib)}` : null,
    slice.devices.length ? `Devices: ${slice.devices.join(', ')}` : null,
    status.exempt ? 'Exempt from idle culling' : null,
    ...status.kernels.map(kernel => {
      const deadline = secondsUntil(kernel.deadline, now);
      const tail = kernel.exempt
        ? 'exempt'
        : deadline === null
          ? 'no deadline'
          : `idle cull in ${formatCountdown(deadline)}`;
      return `${kernel.name} (${kernel.execution_state}): ${formatPercent(kernel.utilization)}, ${formatMemory(kernel.memory_mib)}, ${tail}`;
    })
  ].filter((line): line is string => line !== null);
  return {
    text: parts.join(' · ') + (slice.simulated ? ' (sim)' : ''),
    title: title.join('\n'),
    countdown: near && nearest ? nearest.seconds : null,
    simulated: slice.simulated
  };
}
