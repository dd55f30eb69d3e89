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

const KIND_NAMES: Record<string, string> = {
  mig: 'MIG instance',
  share: 'time-sliced share',
  gpu: 'whole GPU'
};

/** Figures summed over the parts that report one; null where none does. */
export function sumUsage(parts: { utilization: number | null; memory_mib: number | null }[]): {
  utilization: number | null;
  memory_mib: number | null;
} {
  const utils = parts.map(p => p.utilization).filter((v): v is number => typeof v === 'number');
  const mems = parts.map(p => p.memory_mib).filter((v): v is number => typeof v === 'number');
  return {
    utilization: utils.length
      ? Math.min(
          100,
          utils.reduce((a, b) => a + b, 0)
        )
      : null,
    memory_mib: mems.length ? mems.reduce((a, b) => a + b, 0) : null
  };
}

function memoryText(used: number | null | undefined, cap: number | null | undefined): string {
  return cap ? `${formatMemory(used ?? 0)} / ${formatMemory(cap)}` : formatMemory(used);
}

export function statusView(
  status: IStatus,
  now: number,
  notebooks: ReadonlyMap<string, string> = new Map()
): IStatusView {
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
  // The slice's use across its kernels (a server without the total: its kernels summed).
  const total = status.total ?? sumUsage([server, ...status.kernels]);
  const name = slice.display_name || slice.profile;
  const size = slice.memory_mib || slice.memory_cap_mib;
  const parts = [
    `GPU ${name}`,
    formatPercent(total.utilization),
    memoryText(total.memory_mib, size)
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
    // what goes at the deadline: the whole server (its slice with it), or one kernel
    const server = status.policy?.action === 'server' || nearest.kernel.id === '';
    parts.push(
      `idle: ${server ? 'server stops' : 'kernel stops'} in ${formatCountdown(nearest.seconds)}`
    );
  }
  const title = [
    `Slice: ${name} (${slice.profile}, ${KIND_NAMES[slice.kind] ?? slice.kind}${slice.simulated ? ', SIMULATED GPU' : ''})`,
    `In use: ${formatPercent(total.utilization)} of the GPU, ${formatMemory(total.memory_mib)}` +
      (size ? ` of ${formatMemory(size)}` : ''),
    slice.memory_cap_mib ? `Memory cap per kernel: ${formatMemory(slice.memory_cap_mib)}` : null,
    slice.devices.length ? `Devices: ${slice.devices.join(', ')}` : null,
    status.exempt ? 'Exempt from idle culling' : null,
    ...status.kernels.map(kernel => {
      const deadline = secondsUntil(kernel.deadline, now);
      const tail = kernel.exempt
        ? 'exempt'
        : deadline === null
          ? 'no deadline'
          : `idle cull in ${formatCountdown(deadline)}`;
      const name = notebooks.get(kernel.id) ?? kernel.name;
      return `${name} (${kernel.execution_state}): ${formatPercent(kernel.utilization)}, ${formatMemory(kernel.memory_mib)}, ${tail}`;
    })
  ].filter((line): line is string => line !== null);
  return {
    text: parts.join(' · ') + (slice.simulated ? ' (sim)' : ''),
    title: title.join('\n'),
    countdown: near && nearest ? nearest.seconds : null,
    simulated: slice.simulated
  };
}
