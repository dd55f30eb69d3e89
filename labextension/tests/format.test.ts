import {
  formatCountdown,
  formatDuration,
  formatMemory,
  formatPercent,
  secondsSince,
  secondsUntil
} from '../src/format';

describe('format', () => {
  it('formats durations at a useful precision', () => {
    expect(formatDuration(42)).toBe('42s');
    expect(formatDuration(247)).toBe('4m 07s');
    expect(formatDuration(3900)).toBe('1h 05m');
    expect(formatDuration(-5)).toBe('0s');
    expect(formatDuration(null)).toBe('0s');
  });

  it('formats a clock countdown, rounding up so 0:00 means the deadline passed', () => {
    expect(formatCountdown(299.2)).toBe('5:00');
    expect(formatCountdown(59)).toBe('0:59');
    expect(formatCountdown(3723)).toBe('1:02:03');
    expect(formatCountdown(-3)).toBe('0:00');
  });

  it('computes seconds until and since ISO times', () => {
    const now = Date.parse('2026-01-01T12:00:00Z');
    expect(secondsUntil('2026-01-01T12:05:00Z', now)).toBe(300);
    expect(secondsUntil('2026-01-01T11:59:00Z', now)).toBe(-60);
    expect(secondsUntil(null, now)).toBeNull();
    expect(secondsUntil('not a date', now)).toBeNull();
    expect(secondsSince('2026-01-01T11:59:00Z', now)).toBe(60);
    expect(secondsSince('2026-01-01T12:01:00Z', now)).toBe(0);
  });

  it('formats memory and percentages', () => {
    expect(formatMemory(512)).toBe('512 MiB');
    expect(formatMemory(1536)).toBe('1.5 GiB');
    expect(formatMemory(18432)).toBe('18 GiB');
    expect(formatMemory(null)).toBe('–');
    expect(formatPercent(37.4)).toBe('37%');
    expect(formatPercent(140)).toBe('100%');
    expect(formatPercent(null)).toBe('–');
  });
});
