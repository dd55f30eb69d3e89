import { ApiError } from '../src/api';
import { defaultProfile, profileLabel, refusalMessage } from '../src/refusal';
import type { IProfile } from '../src/types';

describe('refusalMessage', () => {
  it('passes on what the server said, framed by status', () => {
    expect(refusalMessage(new ApiError(400, 'unknown profile "gpu-9"'), 'Submitting the job')).toBe(
      'Submitting the job was refused: unknown profile "gpu-9"'
    );
    expect(refusalMessage(new ApiError(403, 'not your job'), 'Cancelling the job')).toBe(
      'Cancelling the job is not allowed: not your job'
    );
    // 429 is a quota or the limit of unfinished jobs: the server's message says which
    expect(
      refusalMessage(new ApiError(429, 'you have 10 unfinished jobs, the limit'), 'Submitting')
    ).toBe('Submitting was refused: you have 10 unfinished jobs, the limit');
    // 413: over the notebook size limit or the disk cap; the message says how to free room
    expect(
      refusalMessage(new ApiError(413, 'your job folders take 11 GiB of 10 GiB'), 'Submitting')
    ).toBe('Submitting was refused: your job folders take 11 GiB of 10 GiB');
    const down = refusalMessage(new ApiError(503, 'GPUSLICE_SERVICE_URL is not set'), 'Loading');
    expect(down).toContain('unavailable (GPUSLICE_SERVICE_URL is not set)');
    expect(down).not.toContain('Try again');
    expect(refusalMessage(new ApiError(504, 'no answer'), 'Loading')).toContain('Try again');
    // the server's own 404 names what is missing; a bare one is a route nothing serves
    expect(refusalMessage(new ApiError(404, 'no job 12'), 'Opening the log')).toBe(
      'Opening the log failed: no job 12'
    );
    expect(refusalMessage(new ApiError(404, 'Not Found'), 'Loading')).toContain(
      'GPU features may not be enabled'
    );
    expect(refusalMessage(new ApiError(0, 'x'), 'Loading jobs')).toContain('could not be reached');
    expect(refusalMessage(new ApiError(418, 'teapot'), 'X')).toBe('X failed (HTTP 418): teapot');
    expect(refusalMessage(new Error('boom'), 'X')).toBe('X failed: boom');
  });
});

describe('profiles in the submit dialog', () => {
  const profiles: IProfile[] = [
    {
      name: 'gpu-1',
      display_name: 'Whole GPU',
      description: '',
      free: 0,
      total: 2,
      available: false,
      reason: 'all 2 in use'
    },
    {
      name: 'share-250',
      display_name: 'Quarter GPU',
      description: '',
      free: 3,
      total: 8,
      available: true,
      reason: null
    }
  ];

  it('labels live availability and why a profile is unavailable', () => {
    expect(profileLabel(profiles[0])).toBe('Whole GPU — unavailable: all 2 in use');
    expect(profileLabel(profiles[1])).toBe('Quarter GPU — 3 of 8 free');
  });

  it('treats a profile only a spawn could take from a batch job as all in use', () => {
    const people = { ...profiles[1], free: 0, from_batch: true };
    expect(profileLabel(people)).toBe('Quarter GPU — all 8 in use');
    expect(defaultProfile([people, profiles[0]])).toBe('share-250'); // none free: the first
    expect(defaultProfile([people, { ...profiles[1], name: 'x' }])).toBe('x');
  });

  it('labels what a batch job may take on a cluster split into pools', () => {
    const split = { ...profiles[1], batch_free: 1, batch_total: 4 };
    expect(profileLabel(split)).toBe('Quarter GPU — 1 of 4 free for batch jobs');
  });

  it('preselects the requested profile, else the first available', () => {
    expect(defaultProfile(profiles, 'gpu-1')).toBe('gpu-1');
    expect(defaultProfile(profiles, 'gone')).toBe('share-250');
    expect(defaultProfile(profiles)).toBe('share-250');
    expect(defaultProfile([])).toBe('');
  });
});
