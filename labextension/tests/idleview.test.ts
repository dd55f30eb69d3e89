import { announcementId, asIdleEvent, idleNotice, missedWarnings } from '../src/idleview';
import { IDLE_SCHEMA_ID } from '../src/types';

const NOW = Date.parse('2026-01-01T12:00:00Z');

describe('idle events', () => {
  it('accepts only gpuslice idle events with a known action', () => {
    expect(asIdleEvent({ schema_id: 'https://example.org/other', action: 'warning' })).toBeNull();
    expect(asIdleEvent({ schema_id: IDLE_SCHEMA_ID, action: 'explode' })).toBeNull();
    expect(
      asIdleEvent({
        schema_id: IDLE_SCHEMA_ID,
        action: 'warning',
        kernel_id: 'k1',
        idle_seconds: 1500,
        deadline: ''
      })
    ).toEqual({
      action: 'warning',
      kernel_id: 'k1',
      deadline: null,
      reason: null,
      idle_seconds: 1500
    });
  });

  it('makes a warning sticky, with actions, and saves notebooks', () => {
    const notice = idleNotice(
      {
        action: 'warning',
        kernel_id: 'k1',
        deadline: '2026-01-01T12:05:00Z',
        reason: null,
        idle_seconds: 1500
      },
      NOW
    );
    expect(notice).toMatchObject({
      key: 'gpuslice-idle-k1',
      type: 'warning',
      // the server keeps its slice: no "release", which would stop the whole server
      actions: 'keep',
      saveNotebooks: true,
      autoClose: false
    });
    expect(notice.message).toContain('idle for 25m 00s');
    expect(notice.message).toContain('in 5m 00s');
    // a kernel's cull frees its memory; the server keeps its slice
    expect(notice.message).toContain('this kernel will be shut down');
    expect(notice.message).toContain('this server keeps its GPU slice');
    const server = idleNotice(
      {
        action: 'warning',
        kernel_id: null,
        deadline: '2026-01-01T12:05:00Z',
        reason: null,
        idle_seconds: 1500
      },
      NOW
    );
    expect(server.actions).toBe('keep-or-release');
    expect(server.message).toContain('this server will be stopped in 5m 00s');
    expect(server.message).toContain('GPU slice given back');
  });

  it('updates the same notification on extended and culled', () => {
    const extended = idleNotice(
      {
        action: 'extended',
        kernel_id: 'k1',
        deadline: '2026-01-01T12:30:00Z',
        reason: null,
        idle_seconds: 0
      },
      NOW
    );
    expect(extended).toMatchObject({ key: 'gpuslice-idle-k1', type: 'success', actions: 'none' });
    expect(extended.message).toContain('30m 00s');
    const culled = idleNotice(
      {
        action: 'culled',
        kernel_id: null,
        deadline: null,
        reason: 'idle for 30m',
        idle_seconds: 1800
      },
      NOW
    );
    expect(culled).toMatchObject({
      key: 'gpuslice-idle-server',
      type: 'error',
      autoClose: false,
      saveNotebooks: false
    });
    expect(culled.message).toContain('The server was stopped and its GPU slice given back');
    expect(culled.message).toContain('idle for 30m');
    const kernelCulled = idleNotice(
      { action: 'culled', kernel_id: 'k1', deadline: null, reason: null, idle_seconds: 1800 },
      NOW
    );
    expect(kernelCulled.message).toContain('The kernel was shut down (idle)');
    expect(kernelCulled.message).toContain('this server keeps its GPU slice');
    expect(kernelCulled.message).not.toContain('given back');
  });

  it('explains memory warnings and culls', () => {
    const warn = idleNotice(
      {
        action: 'memory-warning',
        kernel_id: 'k2',
        deadline: null,
        reason: '5.2 GiB of 4 GiB',
        idle_seconds: null
      },
      NOW
    );
    expect(warn.actions).toBe('release');
    expect(warn.message).toContain('over this slice');
    // warn only (no deadline): nothing will be stopped, and the notice says so
    expect(warn.message).toContain('Nothing is stopped');
    expect(warn.saveNotebooks).toBe(false);
    const acting = idleNotice(
      {
        action: 'memory-warning',
        kernel_id: 'k2',
        deadline: '2026-01-01T12:01:00Z',
        reason: 'kernel uses 5000 MiB; it will be interrupted in 60 s unless it frees memory',
        idle_seconds: null
      },
      NOW
    );
    expect(acting.message).toContain('it will be interrupted in 60 s');
    expect(acting.message).not.toContain('shut down');
    expect(acting.saveNotebooks).toBe(true);
    const culled = idleNotice(
      {
        action: 'memory-culled',
        kernel_id: 'k2',
        deadline: null,
        reason: 'kernel uses 5000 MiB; it was interrupted',
        idle_seconds: null
      },
      NOW
    );
    expect(culled.message).toContain('over this slice');
    expect(culled.message).toContain('it was interrupted');
    expect(culled.message).not.toContain('shut down');
  });
});

describe('missedWarnings', () => {
  const kernel = {
    id: 'k1',
    name: 'python3',
    execution_state: 'idle',
    utilization: 0,
    memory_mib: 0,
    idle_seconds: 1500,
    deadline: '2026-01-01T12:05:00Z',
    warning: true,
    exempt: false
  };

  it('returns each warned (kernel, deadline) once', () => {
    const announced = new Set<string>();
    const first = missedWarnings({ kernels: [kernel], exempt: false }, announced);
    expect(first).toEqual([
      {
        action: 'warning',
        kernel_id: 'k1',
        deadline: kernel.deadline,
        reason: null,
        idle_seconds: 1500
      }
    ]);
    expect(missedWarnings({ kernels: [kernel], exempt: false }, announced)).toEqual([]);
    // A new deadline (kept alive, idle again) is a new warning.
    const later = { ...kernel, deadline: '2026-01-01T13:05:00Z' };
    expect(missedWarnings({ kernels: [later], exempt: false }, announced)).toHaveLength(1);
  });

  it('skips what an event already announced, unwarned and exempt kernels', () => {
    const announced = new Set([announcementId('k1', kernel.deadline)]);
    expect(missedWarnings({ kernels: [kernel], exempt: false }, announced)).toEqual([]);
    const fresh = new Set<string>();
    expect(
      missedWarnings({ kernels: [{ ...kernel, warning: false }], exempt: false }, fresh)
    ).toEqual([]);
    expect(
      missedWarnings({ kernels: [{ ...kernel, exempt: true }], exempt: false }, fresh)
    ).toEqual([]);
    expect(missedWarnings({ kernels: [kernel], exempt: true }, fresh)).toEqual([]);
  });

  it('warns the whole server once under the server action, as its own event does', () => {
    const policy = { action: 'server', idle_timeout: 60, warning_lead: 30, max_extension: 600 };
    const other = { ...kernel, id: 'k2' };
    const announced = new Set<string>();
    const missed = missedWarnings({ kernels: [kernel, other], exempt: false, policy }, announced);
    expect(missed).toEqual([
      {
        action: 'warning',
        kernel_id: null,
        deadline: kernel.deadline,
        reason: null,
        idle_seconds: 1500
      }
    ]);
    // the server's own event already said it: nothing more
    const seen = new Set([announcementId(null, kernel.deadline)]);
    expect(missedWarnings({ kernels: [kernel, other], exempt: false, policy }, seen)).toEqual([]);
  });
});
