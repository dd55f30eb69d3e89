import { ApiError, GpusliceApi, type Transport } from '../src/api';

interface ICall {
  path: string;
  init: RequestInit;
}

function fakeFetch(reply: () => Response | Promise<Response>): {
  api: GpusliceApi;
  calls: ICall[];
} {
  const calls: ICall[] = [];
  const transport: Transport = async (path, init) => {
    calls.push({ path, init });
    return reply();
  };
  return { api: new GpusliceApi(transport), calls };
}

const json = (status: number, body: unknown): Response =>
  new Response(JSON.stringify(body), {
    status,
    headers: { 'Content-Type': 'application/json' }
  });

describe('GpusliceApi', () => {
  it('GETs status and returns the parsed body', async () => {
    const { api, calls } = fakeFetch(() => json(200, { slice: null, kernels: [], exempt: false }));
    const status = await api.status();
    expect(status.kernels).toEqual([]);
    expect(calls).toEqual([{ path: 'status', init: { method: 'GET' } }]);
  });

  it('POSTs keepalive with a JSON body', async () => {
    const { api, calls } = fakeFetch(() =>
      json(200, { kernels: [{ id: 'k1', deadline: null }], extension_left_seconds: 600 })
    );
    const reply = await api.keepalive({ kernel_id: 'k1' });
    expect(reply.extension_left_seconds).toBe(600);
    expect(calls[0].init.method).toBe('POST');
    expect(JSON.parse(calls[0].init.body as string)).toEqual({ kernel_id: 'k1' });
    expect(calls[0].init.headers).toEqual({ 'Content-Type': 'application/json' });
  });

  it('turns a 400 with {"message"} into an ApiError carrying that message', async () => {
    const { api } = fakeFetch(() => json(400, { message: 'beyond the maximum extension of 2h' }));
    const error = await api.keepalive({ seconds: 99999 }).catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(400);
    expect(error.message).toBe('beyond the maximum extension of 2h');
  });

  it('does not show an HTML error page as a message', async () => {
    const { api } = fakeFetch(
      () =>
        new Response('<html><body>500</body></html>', {
          status: 500,
          statusText: 'Internal Server Error'
        })
    );
    const error = await api.jobs().catch(e => e);
    expect(error.status).toBe(500);
    expect(error.message).toBe('Internal Server Error');
  });

  it('reports a network failure as status 0', async () => {
    const { api } = fakeFetch(() => Promise.reject(new TypeError('Failed to fetch')));
    const error = await api.profiles().catch(e => e);
    expect(error).toBeInstanceOf(ApiError);
    expect(error.status).toBe(0);
    expect(error.message).toContain('Failed to fetch');
  });

  it('accepts the jobs list as {"jobs": [...]} or a bare list', async () => {
    const job = { id: '7', state: 'queued' };
    expect(await fakeFetch(() => json(200, { jobs: [job] })).api.jobs()).toEqual([job]);
    expect(await fakeFetch(() => json(200, [job])).api.jobs()).toEqual([job]);
  });

  it('escapes job ids in paths and uses the documented verbs', async () => {
    const { api, calls } = fakeFetch(() => json(200, {}));
    await api.job('a/b');
    await api.cancel('j1');
    await api.resubmit('j1');
    await api.submit({
      path: 'x.ipynb',
      profile: 'share-250',
      priority: 'normal',
      checkpoint_interval: 600,
      parameters: { n: 1 }
    });
    expect(calls.map(c => `${c.init.method} ${c.path}`)).toEqual([
      'GET jobs/a%2Fb',
      'DELETE jobs/j1',
      'POST jobs/j1/resubmit',
      'POST jobs'
    ]);
    expect(JSON.parse(calls[3].init.body as string).profile).toBe('share-250');
  });

  it('reads a log as text or as {"log"}', async () => {
    expect(await fakeFetch(() => new Response('line 1\nline 2')).api.log('j')).toBe(
      'line 1\nline 2'
    );
    expect(await fakeFetch(() => json(200, { log: 'from json' })).api.log('j')).toBe('from json');
  });

  it('handles an empty 204 reply', async () => {
    const { api } = fakeFetch(() => new Response(null, { status: 204 }));
    expect(await api.cancel('j1')).toBeNull();
  });
});
