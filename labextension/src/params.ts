// Parsing and validating what the submit dialog's fields hold, before anything is sent.
import { formatDuration } from './format';
import { PRIORITIES, type ISubmitRequest, type Priority } from './types';

export type Parsed<T> = { ok: true; value: T } | { ok: false; error: string };

const UNIT_SECONDS: Record<string, number> = { s: 1, m: 60, h: 3600, d: 86400 };

/**
 * What an empty checkpoint interval field means, given what the max runtime field holds:
 * the service uses its default, but never more than the job's max runtime (issue 44: with a
 * 5 min max runtime the field said "empty: 10m 00s" and the job got 300 s).
 */
export function checkpointPlaceholder(
  defaultInterval: number,
  defaultRuntime: number,
  runtimeText: string
): string {
  const typed = parseDuration(runtimeText, 'Max runtime');
  const runtime = typed.ok && typed.value !== null ? typed.value : defaultRuntime;
  if (runtime < defaultInterval) {
    return `empty: ${formatDuration(runtime)} (capped at the max runtime)`;
  }
  return `empty: ${formatDuration(defaultInterval)} (at most the max runtime, and 24h)`;
}

/**
 * A duration typed by a person: "90" (seconds), "90s", "15m", "2h", "1h30m", "1d".
 * Empty input is `null` (no limit / the server's default).
 */
export function parseDuration(text: string, field: string): Parsed<number | null> {
  const trimmed = text.trim().toLowerCase().replace(/\s+/g, '');
  if (!trimmed) {
    return { ok: true, value: null };
  }
  if (/^\d+$/.test(trimmed)) {
    const value = Number(trimmed);
    return value > 0
      ? { ok: true, value }
      : { ok: false, error: `${field} must be more than zero.` };
  }
  if (!/^(\d+[smhd])+$/.test(trimmed)) {
    return {
      ok: false,
      error: `${field}: "${text.trim()}" is not a duration; write e.g. 90s, 15m, 2h or 1h30m.`
    };
  }
  let total = 0;
  for (const match of trimmed.matchAll(/(\d+)([smhd])/g)) {
    total += Number(match[1]) * UNIT_SECONDS[match[2]];
  }
  return total > 0
    ? { ok: true, value: total }
    : { ok: false, error: `${field} must be more than zero.` };
}

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
// Python's keywords (keyword.kwlist): a parameter so named fails the job's first cell
const KEYWORDS = new Set(
  (
    'False None True and as assert async await break class continue def del elif else ' +
    'except finally for from global if import in is lambda nonlocal not or pass raise ' +
    'return try while with yield'
  ).split(' ')
);

/** Why `name` cannot be a parameter, or null. */
function badName(name: string): string | null {
  if (!NAME.test(name)) {
    return `"${name}" is not a valid Python variable name.`;
  }
  return KEYWORDS.has(name) ? `"${name}" is a Python keyword, not a variable name.` : null;
}

function parseValue(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/**
 * Notebook parameters, either a JSON object or one `name = value` per line (values that are
 * valid JSON — numbers, true/false, quoted strings, lists — keep their type; anything else
 * is a string). Blank lines and lines starting with # are skipped.
 */
export function parseParameters(text: string): Parsed<Record<string, unknown>> {
  const trimmed = text.trim();
  if (!trimmed) {
    return { ok: true, value: {} };
  }
  if (trimmed.startsWith('{')) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(trimmed);
    } catch (error) {
      return { ok: false, error: `Parameters are not valid JSON: ${(error as Error).message}` };
    }
    if (!parsed || typeof parsed !== 'object' || Array.isArray(parsed)) {
      return { ok: false, error: 'Parameters must be a JSON object.' };
    }
    for (const key of Object.keys(parsed)) {
      const why = badName(key);
      if (why) {
        return { ok: false, error: why };
      }
    }
    return { ok: true, value: parsed as Record<string, unknown> };
  }
  const value: Record<string, unknown> = {};
  const lines = trimmed.split(/\r?\n/);
  for (let index = 0; index < lines.length; index++) {
    const line = lines[index].trim();
    if (!line || line.startsWith('#')) {
      continue;
    }
    const eq = line.indexOf('=');
    if (eq <= 0) {
      return { ok: false, error: `Line ${index + 1}: write name = value.` };
    }
    const name = line.slice(0, eq).trim();
    const why = badName(name);
    if (why) {
      return { ok: false, error: `Line ${index + 1}: ${why}` };
    }
    if (name in value) {
      return { ok: false, error: `Line ${index + 1}: "${name}" is given twice.` };
    }
    value[name] = parseValue(line.slice(eq + 1).trim());
  }
  return { ok: true, value };
}

export interface ISubmitForm {
  path: string;
  profile: string;
  priority: string;
  checkpointInterval: string;
  maxRuntime: string;
  parameters: string;
  /** A time window's name, or '' for any time. */
  timeWindow: string;
  /** May be sent to the site's burst partition when it waits too long. */
  burstable: boolean;
  /** The longest max runtime the service allows (seconds), once it said. */
  maxRuntimeLimit?: number | null;
}

/** All problems with the form at once, or the request body to send. */
export function buildSubmitRequest(
  form: ISubmitForm
): { ok: true; value: ISubmitRequest } | { ok: false; errors: string[] } {
  const errors: string[] = [];
  if (!form.path.trim()) {
    errors.push('Choose a notebook to submit.');
  } else if (!form.path.endsWith('.ipynb')) {
    errors.push(`${form.path} is not a notebook (.ipynb).`);
  }
  if (!form.profile) {
    errors.push('Choose a GPU profile.');
  }
  if (!PRIORITIES.includes(form.priority as Priority)) {
    errors.push(`Priority must be one of ${PRIORITIES.join(', ')}.`);
  }
  const checkpoint = parseDuration(form.checkpointInterval, 'Checkpoint interval');
  const runtime = parseDuration(form.maxRuntime, 'Max runtime');
  const parameters = parseParameters(form.parameters);
  for (const parsed of [checkpoint, runtime, parameters]) {
    if (!parsed.ok) {
      errors.push(parsed.error);
    }
  }
  if (errors.length || !checkpoint.ok || !runtime.ok || !parameters.ok) {
    return { ok: false, errors };
  }
  const limit = form.maxRuntimeLimit;
  if (runtime.value !== null && limit && runtime.value > limit) {
    return {
      ok: false,
      errors: [
        `Max runtime ${formatDuration(runtime.value)} is longer than this site allows (${formatDuration(limit)}).`
      ]
    };
  }
  if (checkpoint.value !== null && runtime.value !== null && checkpoint.value > runtime.value) {
    return { ok: false, errors: ['The checkpoint interval is longer than the max runtime.'] };
  }
  const value: ISubmitRequest = {
    path: form.path.trim(),
    profile: form.profile,
    priority: form.priority as Priority,
    parameters: parameters.value
  };
  if (checkpoint.value !== null) {
    value.checkpoint_interval = checkpoint.value;
  }
  if (runtime.value !== null) {
    value.max_runtime = runtime.value;
  }
  if (form.timeWindow) {
    value.time_window = form.timeWindow;
  }
  if (form.burstable) {
    value.burstable = true;
  }
  return { ok: true, value };
}
