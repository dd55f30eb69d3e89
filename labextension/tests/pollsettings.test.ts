import plugin from '../schema/plugin.json';
import { POLL_SETTINGS, pollIntervals } from '../src/pollsettings';

const schema = plugin as {
  properties: Record<string, { default: number; minimum: number; type: string }>;
};

describe('poll settings', () => {
  it('are exactly the schema properties, with its defaults and minimums', () => {
    expect(Object.keys(POLL_SETTINGS).sort()).toEqual(Object.keys(schema.properties).sort());
    for (const [name, spec] of Object.entries(POLL_SETTINGS)) {
      expect(schema.properties[name].type).toBe('number');
      expect(schema.properties[name].default).toBe(spec.defaultSeconds);
      expect(schema.properties[name].minimum).toBe(spec.minimumSeconds);
    }
  });

  it('default to the schema when nothing is set', () => {
    expect(pollIntervals()).toEqual({
      statusMs: 5000,
      jobsMs: 3000,
      jobsHiddenMs: 30000,
      profilesMs: 5000
    });
  });

  it('take the user values in seconds, and keep sane ones for bad input', () => {
    const got = pollIntervals({
      statusPollSeconds: 12.5,
      jobsPollSeconds: 0,
      jobsHiddenPollSeconds: 'often',
      profilesPollSeconds: Number.NaN
    });
    expect(got).toEqual({
      statusMs: 12500,
      jobsMs: 1000, // raised to the minimum
      jobsHiddenMs: 30000,
      profilesMs: 5000
    });
  });
});
