// A small typed client for the single-user server's gpuslice routes. The transport is
// injected (in the lab: ServerConnection.makeRequest, see connection.ts) so that Jest can
// drive it with a mocked fetch.
import type {
  IJob,
  IKeepaliveReply,
  IKeepaliveRequest,
  IProfiles,
  IStatus,
  ISubmitRequest
} from './types';

type JobId = IJob['id'];

/** Sends one request to `<base_url>/gpuslice/api/<path>`. */
export type Transport = (path: string, init: RequestInit) => Promise<Response>;

/** An HTTP refusal (4xx/5xx) or a failure to reach the server at all (status 0). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    message: string,
    readonly body: unknown = null
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

async function readBody(response: Response): Promise<unknown> {
  const text = await response.text();
  if (!text) {
    return null;
  }
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function errorMessage(response: Response, body: unknown): string {
  if (body && typeof body === 'object' && 'message' in body) {
    const message = (body as { message: unknown }).message;
    if (typeof message === 'string' && message) {
      return message;
    }
  }
  // Tornado's default error page is HTML; it is no message for a person.
  if (typeof body === 'string' && body && !body.trimStart().startsWith('<')) {
    return body.slice(0, 300);
  }
  return response.statusText || `HTTP ${response.status}`;
}

export class GpusliceApi {
  constructor(private readonly transport: Transport) {}

  status(): Promise<IStatus> {
    return this.call<IStatus>('GET', 'status');
  }

  keepalive(request: IKeepaliveRequest = {}): Promise<IKeepaliveReply> {
    return this.call<IKeepaliveReply>('POST', 'keepalive', request);
  }

  release(): Promise<unknown> {
    return this.call('POST', 'release', {});
  }

  profiles(): Promise<IProfiles> {
    return this.call<IProfiles>('GET', 'profiles');
  }

  async jobs(): Promise<IJob[]> {
    const reply = await this.call<{ jobs: IJob[] } | IJob[]>('GET', 'jobs');
    return Array.isArray(reply) ? reply : (reply?.jobs ?? []);
  }

  job(id: JobId): Promise<IJob> {
    return this.call<IJob>('GET', `jobs/${encodeURIComponent(String(id))}`);
  }

  submit(request: ISubmitRequest): Promise<IJob> {
    return this.call<IJob>('POST', 'jobs', request);
  }

  cancel(id: JobId): Promise<IJob | null> {
    return this.call<IJob | null>('DELETE', `jobs/${encodeURIComponent(String(id))}`);
  }

  resubmit(id: JobId): Promise<IJob> {
    return this.call<IJob>('POST', `jobs/${encodeURIComponent(String(id))}/resubmit`, {});
  }

  /** The job's log; the route may answer plain text or `{"log": ...}`. */
  async log(id: JobId): Promise<string> {
    const reply = await this.call<unknown>('GET', `jobs/${encodeURIComponent(String(id))}/log`);
    if (typeof reply === 'string') {
      return reply;
    }
    if (reply && typeof reply === 'object' && 'log' in reply) {
      return String((reply as { log: unknown }).log ?? '');
    }
    return '';
  }

  private async call<T>(method: string, path: string, body?: unknown): Promise<T> {
    const init: RequestInit = { method };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers = { 'Content-Type': 'application/json' };
    }
    let response: Response;
    try {
      response = await this.transport(path, init);
    } catch (error) {
      const reason = error instanceof Error ? error.message : String(error);
      throw new ApiError(0, `Could not reach the server: ${reason}`);
    }
    const parsed = await readBody(response);
    if (!response.ok) {
      throw new ApiError(response.status, errorMessage(response, parsed), parsed);
    }
    return parsed as T;
  }
}
