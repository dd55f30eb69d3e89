import {
  checkpointPlaceholder,
  buildSubmitRequest,
  parseDuration,
  parseParameters
} from '../src/params';

describe('parseDuration', () => {
  it('accepts seconds and unit suffixes', () => {
    expect(parseDuration('90', 'X')).toEqual({ ok: true, value: 90 });
    expect(parseDuration('15m', 'X')).toEqual({ ok: true, value: 900 });
    expect(parseDuration(' 1h 30m ', 'X')).toEqual({ ok: true, value: 5400 });
    expect(parseDuration('1d', 'X')).toEqual({ ok: true, value: 86400 });
    expect(parseDuration('', 'X')).toEqual({ ok: true, value: null });
  });

  it('refuses nonsense and zero with the field name', () => {
    const bad = parseDuration('soon', 'Max runtime');
    expect(bad.ok).toBe(false);
    expect(!bad.ok && bad.error).toContain('Max runtime');
    expect(parseDuration('0', 'X').ok).toBe(false);
    expect(parseDuration('0m', 'X').ok).toBe(false);
    expect(parseDuration('-5', 'X').ok).toBe(false);
    expect(parseDuration('1.5h', 'X').ok).toBe(false);
  });
});

describe('parseParameters', () => {
  it('parses name = value lines, keeping JSON types', () => {
    expect(
      parseParameters('lr = 0.01\nepochs=5\nname = resnet\n# comment\n\nflags = [1, 2]\nok = true')
    ).toEqual({
      ok: true,
      value: { lr: 0.01, epochs: 5, name: 'resnet', flags: [1, 2], ok: true }
    });
  });

  it('parses a JSON object', () => {
    expect(parseParameters('{"lr": 0.1, "tag": "x"}')).toEqual({
      ok: true,
      value: { lr: 0.1, tag: 'x' }
    });
    expect(parseParameters('')).toEqual({ ok: true, value: {} });
  });

  it('refuses what cannot become a Python variable', () => {
    const cases = ['lr', '1x = 3', 'a = 1\na = 2', '{"a": ', '[1, 2]', '{"bad name": 1}'];
    for (const text of cases) {
      const parsed = parseParameters(text);
      expect(parsed.ok).toBe(false);
    }
    const twice = parseParameters('a = 1\na = 2');
    expect(!twice.ok && twice.error).toBe('Line 2: "a" is given twice.');
    // a keyword would fail the job's first cell (the injected one) on the server
    const keyword = parseParameters('epochs = 3\nimport = 3');
    expect(!keyword.ok && keyword.error).toBe(
      'Line 2: "import" is a Python keyword, not a variable name.'
    );
    const inJson = parseParameters('{"None": 1}');
    expect(!inJson.ok && inJson.error).toBe('"None" is a Python keyword, not a variable name.');
    // names that only look like keywords (soft keywords, builtins) are variables
    expect(parseParameters('match = 1\ntype = 2\nprint = 3').ok).toBe(true);
  });
});

describe('buildSubmitRequest', () => {
  const form = {
    path: 'work/train.ipynb',
    profile: 'share-250',
    priority: 'preemptible',
    checkpointInterval: '10m',
    maxRuntime: '2h',
    parameters: 'epochs = 3',
    timeWindow: '',
    burstable: false
  };

  it('asks to burst only when the box was ticked', () => {
    const ticked = buildSubmitRequest({ ...form, burstable: true });
    expect(ticked.ok && ticked.value.burstable).toBe(true);
    const not = buildSubmitRequest(form);
    expect(not.ok && 'burstable' in not.value).toBe(false);
  });

  it('names the time window only when one was chosen', () => {
    const chosen = buildSubmitRequest({ ...form, timeWindow: 'night' });
    expect(chosen.ok && chosen.value.time_window).toBe('night');
    const any = buildSubmitRequest(form);
    expect(any.ok && 'time_window' in any.value).toBe(false);
  });

  it('builds the request body of the contract', () => {
    expect(buildSubmitRequest(form)).toEqual({
      ok: true,
      value: {
        path: 'work/train.ipynb',
        profile: 'share-250',
        priority: 'preemptible',
        checkpoint_interval: 600,
        max_runtime: 7200,
        parameters: { epochs: 3 }
      }
    });
  });

  it('refuses a max runtime over the limit the service gave, in its own units', () => {
    const over = buildSubmitRequest({ ...form, maxRuntime: '999999h', maxRuntimeLimit: 604800 });
    expect(!over.ok && over.errors).toEqual([
      'Max runtime 999999h 00m is longer than this site allows (168h 00m).'
    ]);
    expect(buildSubmitRequest({ ...form, maxRuntime: '168h', maxRuntimeLimit: 604800 }).ok).toBe(
      true
    );
    // before the service has said, the service checks it
    expect(buildSubmitRequest({ ...form, maxRuntime: '999999h' }).ok).toBe(true);
  });

  it('lists every problem at once', () => {
    const result = buildSubmitRequest({
      ...form,
      path: 'notes.txt',
      profile: '',
      priority: 'urgent',
      maxRuntime: 'forever',
      parameters: '1 = 2'
    });
    expect(result.ok).toBe(false);
    expect(!result.ok && result.errors).toHaveLength(5);
  });

  it('leaves out empty durations so the service applies its defaults', () => {
    const result = buildSubmitRequest({ ...form, checkpointInterval: '', maxRuntime: ' ' });
    expect(result.ok && result.value).toEqual({
      path: 'work/train.ipynb',
      profile: 'share-250',
      priority: 'preemptible',
      parameters: { epochs: 3 }
    });
  });

  it('refuses a checkpoint interval longer than the max runtime', () => {
    const result = buildSubmitRequest({ ...form, checkpointInterval: '3h' });
    expect(!result.ok && result.errors).toEqual([
      'The checkpoint interval is longer than the max runtime.'
    ]);
  });
});

describe('checkpointPlaceholder', () => {
  it('says the interval an empty field gets: the default, never past the max runtime', () => {
    // issue 44: a 5 min max runtime gave the job 300 s while the field said 10m 00s
    expect(checkpointPlaceholder(600, 86400, '5m')).toBe(
      'empty: 5m 00s (capped at the max runtime)'
    );
    expect(checkpointPlaceholder(600, 86400, '')).toBe(
      'empty: 10m 00s (at most the max runtime, and 24h)'
    );
    expect(checkpointPlaceholder(600, 86400, '2h')).toBe(
      'empty: 10m 00s (at most the max runtime, and 24h)'
    );
    // the service's default max runtime when the field is empty, or not a duration
    expect(checkpointPlaceholder(600, 300, 'soon')).toBe(
      'empty: 5m 00s (capped at the max runtime)'
    );
  });
});
