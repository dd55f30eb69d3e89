// The lab-side transport for GpusliceApi: the server's own settings (base_url, XSRF token,
// auth headers) through ServerConnection.makeRequest.
import { URLExt } from '@jupyterlab/coreutils';
import { ServerConnection } from '@jupyterlab/services';

import { GpusliceApi, type Transport } from './api';

export function createApi(settings?: ServerConnection.ISettings): GpusliceApi {
  const resolved = settings ?? ServerConnection.makeSettings();
  const transport: Transport = (path, init) =>
    ServerConnection.makeRequest(
      URLExt.join(resolved.baseUrl, 'gpuslice', 'api', path),
      init,
      resolved
    );
  return new GpusliceApi(transport);
}
