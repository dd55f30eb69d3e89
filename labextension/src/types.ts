// Shapes of the single-user server's gpuslice routes (see the server extension's handlers).
// Every field the server may omit or null is typed as such, so the UI handles it.

export interface ISlice {
  profile: string;
  /** As the spawn form showed it (older servers: absent). */
  display_name?: string | null;
  kind: string;
  gpu_milli: number | null;
  /** Enforced per kernel by the server extension; 0/null: none (or MPS enforces it). */
  memory_cap_mib: number | null;
  /** The slice's GPU memory (share cap, MIG instance or whole GPU). */
  memory_mib?: number | null;
  devices: string[];
  simulated: boolean;
  idle_timeout: number | null;
}

export interface IServerUsage {
  utilization: number | null;
  memory_mib: number | null;
  attribution?: string | null;
  /** Set when the policy culls the whole server rather than single kernels. */
  deadline?: string | null;
}

export interface IKernelActivity {
  id: string;
  name: string;
  execution_state: string;
  utilization: number | null;
  memory_mib: number | null;
  idle_seconds: number | null;
  deadline: string | null;
  warning: boolean;
  exempt: boolean;
  attribution?: string | null;
}

export interface IPolicy {
  action: string;
  idle_timeout: number | null;
  warning_lead: number | null;
  max_extension: number | null;
}

export interface IUsage {
  utilization: number | null;
  memory_mib: number | null;
}

export interface IStatus {
  slice: ISlice | null;
  server: IServerUsage | null;
  kernels: IKernelActivity[];
  /** The whole slice: every kernel and the server's own GPU processes. */
  total?: IUsage | null;
  policy: IPolicy | null;
  exempt: boolean;
}

export interface IKeepaliveRequest {
  kernel_id?: string;
  seconds?: number;
}

export interface IKeepaliveReply {
  kernels: { id: string; deadline: string | null }[];
  extension_left_seconds: number | null;
}

export type Priority = 'preemptible' | 'normal' | 'high';

export const PRIORITIES: Priority[] = ['preemptible', 'normal', 'high'];

export interface IProfile {
  name: string;
  display_name: string;
  description: string;
  free: number | null;
  total: number | null;
  /** With split pools: what a batch job may take at any hour (the peak pool). */
  batch_free?: number;
  batch_total?: number;
  available: boolean;
  reason: string | null;
  /** None free, but an interactive spawn would take a preemptible job's slice (a batch
   * job would queue: the submit dialog treats it as all in use). */
  from_batch?: boolean;
}

/** A time window batch jobs may be limited to (the admin's JobManager.time_windows). */
export interface ITimeWindow {
  name: string;
  /** e.g. "mon-fri 19:00-07:00 (Europe/Berlin)" */
  text: string;
  open: boolean;
  opens_at: string | null;
  closes_at: string | null;
}

/** The site's burst partition (the admin's JobManager.burst_partition). */
export interface IBurst {
  partition: string;
  /** the fraction of its max runtime a job waits before it is sent */
  after_wait: number;
  /** or at once while the cluster has been allocated above this for 10 minutes (0: never) */
  allocated_above: number;
}

export interface IJobDefaults {
  checkpoint_interval: number;
  max_runtime: number;
  max_runtime_limit: number;
  windows?: ITimeWindow[];
  /** priority class -> the window every job of the class runs in */
  class_windows?: Record<string, string>;
  /** Where a burstable job may be sent when it waits too long (null: nowhere). */
  burst?: IBurst | null;
  /** The priority classes the caller may submit (JobManager.priority_access); null: any. */
  allowed_priorities?: string[] | null;
}

export interface IProfiles {
  profiles: IProfile[];
  simulated: boolean;
  /** What a submission gets for a field it leaves out (null: no job scheduler). */
  jobs?: IJobDefaults | null;
}

export interface ITransition {
  state?: string;
  at?: string;
  reason?: string | null;
  [key: string]: unknown;
}

export interface IJob {
  /** The service's job id (an integer there; kept opaque here). */
  id: number | string;
  name: string;
  user: string;
  state: string;
  profile: string;
  priority: Priority | string;
  checkpoint_interval: number | null;
  max_runtime: number | null;
  parameters: Record<string, unknown>;
  /** Runs started again after the runner died (preemptions are counted apart). */
  restarts: number;
  preemptions?: number;
  lost_work_seconds: number | null;
  /** While preempting: when its grace period ends (it is killed then if still running). */
  preempt_deadline?: string | null;
  /** Seconds on a GPU of the runs that ended (the current one not included). */
  run_seconds?: number;
  /** When the current run began; null while none is on. */
  attempt_started_at?: string | null;
  cells_done: number | null;
  cells_total: number | null;
  last_checkpoint_at: string | null;
  submitted_at: string | null;
  started_at: string | null;
  finished_at: string | null;
  /** Why a queued job is not running yet (e.g. no free slice). */
  waiting_reason?: string | null;
  /** The time window the job may run in (null: any time). */
  time_window?: string | null;
  burstable?: boolean;
  /** In the site's burst partition now (capacity bought elsewhere). */
  on_burst?: boolean;
  burst_gpu_hours?: number;
  error: string | null;
  /** The job's folder (or output notebook), relative to the user's notebook root. */
  output_path: string | null;
  path?: string | null;
  log_tail: string | null;
  transitions: ITransition[];
  /** Only in the answer to a submission: what may make the result not what was asked. */
  warnings?: string[];
}

/** Fields left out take the service's defaults (it refuses nulls). */
export interface ISubmitRequest {
  path: string;
  profile: string;
  priority: Priority;
  checkpoint_interval?: number;
  max_runtime?: number;
  parameters: Record<string, unknown>;
  time_window?: string;
  burstable?: boolean;
}

export const JOBS_SCHEMA_ID = 'https://events.gpuslice.dev/jobs/v1';

export const IDLE_SCHEMA_ID = 'https://events.gpuslice.dev/idle/v1';

export type IdleAction =
  'warning' | 'extended' | 'culled' | 'memory-warning' | 'memory-culled' | 'released';

export interface IIdleEvent {
  action: IdleAction;
  kernel_id: string | null;
  deadline: string | null;
  reason: string | null;
  idle_seconds: number | null;
}
