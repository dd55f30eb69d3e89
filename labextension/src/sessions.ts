// Which notebook each running kernel belongs to, from the lab's sessions: messages and the
// status bar's tooltip name the notebook, not the kernel spec ("python3" twice says nothing).
import type { JupyterFrontEnd } from '@jupyterlab/application';

/** Kernel id → the file name of its notebook (or console), for the kernels this lab knows. */
export function kernelNotebooks(app: JupyterFrontEnd): Map<string, string> {
  const names = new Map<string, string>();
  for (const session of app.serviceManager.sessions.running()) {
    if (session.kernel) {
      names.set(session.kernel.id, session.path.split('/').pop() || session.path);
    }
  }
  return names;
}
