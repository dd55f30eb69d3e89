import { nearestDeadline, statusView } from '../src/statusview';
import type { IKernelActivity, IStatus } from '../src/types';

const NOW = Date.parse('2026-01-01T12:00:00Z');

function kernel(overrides: Partial<IKernelActivity>): IKernelActivity {
  return {
    id: 'k',
    name: 'python3',
    execution_state: 'idle',
    utilization: 0,
    memory_mib: 0,
    idle_seconds: 0,
    deadline: null,
    warning: false,
    exempt: false,
    ...overrides
  };
}

function status(kernels: IKernelActivity[], extra: Partial<IStatus> = {}): IStatus {
  return {
    slice: {
      profile: 'share-250',
      kind: 'share',
      gpu_milli: 250,
      memory_cap_mib: 4096,
      devices: ['GPU-1'],
      simulated: false,
      idle_timeout: 1800
    },
    server: { utilization: 23, memory_mib: 1536 },
    kernels,
    policy: { action: 'kernel', idle_timeout: 1800, warning_lead: 300, max_extension: 7200 },
    exempt: false,
    ...extra
  };
}

describe('statusView', () => {
  it('shows the slice, utilization and memory against the cap', () => {
    const view = statusView(status([kernel({ deadline: '2026-01-01T12:20:00Z' })]), NOW);
    expect(view.text).toBe('GPU share-250 · 23% · 1.5 GiB / 4.0 GiB');
    expect(view.countdown).toBeNull();
    expect(view.title).toContain('idle cull in 20:00');
  });

  it('names each kernel by its notebook in the tooltip, where the lab knows it', () => {
    const view = statusView(
      status([kernel({ id: 'a', execution_state: 'busy' }), kernel({ id: 'b' })]),
      NOW,
      new Map([['a', 'train.ipynb']])
    );
    expect(view.title).toContain('train.ipynb (busy): ');
    expect(view.title).toContain('python3 (idle): '); // (a kernel the lab has no session of)
  });

  it('adds the idle countdown when the nearest deadline is within the warning lead', () => {
    const view = statusView(
      status([
        kernel({ id: 'a', deadline: '2026-01-01T12:04:10Z' }),
        kernel({ id: 'b', deadline: '2026-01-01T12:01:00Z', exempt: true })
      ]),
      NOW
    );
    expect(view.countdown).toBe(250);
    expect(view.text).toContain('idle: kernel stops in 4:10');
  });

  it('shows the countdown for a warned kernel even beyond the lead', () => {
    const view = statusView(
      status([kernel({ deadline: '2026-01-01T12:10:00Z', warning: true })]),
      NOW
    );
    expect(view.text).toContain('idle: kernel stops in 10:00');
  });

  it('counts down to a server-wide deadline', () => {
    const view = statusView(
      status([kernel({ deadline: null })], {
        server: { utilization: 0, memory_mib: 0, deadline: '2026-01-01T12:02:00Z' }
      }),
      NOW
    );
    expect(view.countdown).toBe(120);
    expect(view.text).toContain('idle: server stops in 2:00');
  });

  it('shows no countdown for an exempt server', () => {
    const view = statusView(
      status([kernel({ deadline: '2026-01-01T12:01:00Z' })], { exempt: true }),
      NOW
    );
    expect(view.countdown).toBeNull();
    expect(view.title).toContain('Exempt');
  });

  it('labels a simulated GPU and a server without a slice', () => {
    const simulated = status([]);
    simulated.slice!.simulated = true;
    expect(statusView(simulated, NOW).text).toMatch(/\(sim\)$/);
    expect(statusView(simulated, NOW).title).toContain('SIMULATED');
    expect(statusView(status([], { slice: null }), NOW).text).toBe('GPU: none');
  });

  it('shows the whole slice: every kernel, not only the server', () => {
    // A busy kernel at 73 % with the server's own processes idle must not read 0 %.
    const busy = status([kernel({ utilization: 73, memory_mib: 2048 })], {
      server: { utilization: 0, memory_mib: 0 },
      total: { utilization: 73, memory_mib: 2048 }
    });
    expect(statusView(busy, NOW).text).toBe('GPU share-250 · 73% · 2.0 GiB / 4.0 GiB');
    // an older server without the total: its parts are summed
    const older = status([kernel({ utilization: 40 }), kernel({ id: 'k2', utilization: 33 })], {
      server: { utilization: 0, memory_mib: 0 }
    });
    expect(statusView(older, NOW).text).toContain(' · 73% · ');
    expect(statusView(status([], { server: null }), NOW).text).toContain(' · – · ');
  });

  it('names the slice as the spawn form did and shows a MIG slice its memory', () => {
    const mig = status([], {
      slice: {
        profile: 'mig-3g',
        display_name: 'Half A100 (MIG 3g.40gb)',
        kind: 'mig',
        gpu_milli: 428,
        memory_cap_mib: 0,
        memory_mib: 40960,
        devices: ['MIG-1'],
        simulated: false,
        idle_timeout: 1800
      },
      total: { utilization: 12, memory_mib: 1024 }
    });
    const view = statusView(mig, NOW);
    expect(view.text).toBe('GPU Half A100 (MIG 3g.40gb) · 12% · 1.0 GiB / 40 GiB');
    expect(view.title).toContain('(mig-3g, MIG instance)');
    expect(view.title).not.toContain('Memory cap per kernel');
  });

  it('finds the nearest non-exempt deadline', () => {
    expect(nearestDeadline([kernel({ deadline: null })], NOW)).toBeNull();
    const best = nearestDeadline(
      [
        kernel({ id: 'x', deadline: '2026-01-01T12:09:00Z' }),
        kernel({ id: 'y', deadline: '2026-01-01T12:03:00Z' })
      ],
      NOW
    );
    expect(best?.kernel.id).toBe('y');
    expect(best?.seconds).toBe(180);
  });
});
