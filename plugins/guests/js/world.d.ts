// The taskhost:plugin@0.1.1 world (wit/task-plugin.wit) as seen from a componentize-js guest.
// Generated with: jco guest-types wit -n task-plugin (@bytecodealliance/jco 1.35.0), files concatenated.
// Regenerate when the WIT changes (npm run types). Imports: import { sleep } from 'taskhost:plugin/host@0.1.1';

declare module 'taskhost:plugin/types@0.1.2' {
  /**
   * Severity of a log line sent with `host.log`.
   * # Variants
   * 
   * ## `"trace"`
   * 
   * ## `"debug"`
   * 
   * ## `"info"`
   * 
   * ## `"warn"`
   * 
   * ## `"error"`
   */
  export type Level = 'trace' | 'debug' | 'info' | 'warn' | 'error';
  /**
   * What the host's admission controller does when a new submission
   * targets a slot that is already owned by another task.
   * # Variants
   * 
   * ## `"queue"`
   * 
   * Wait in the slot's FIFO queue behind the current owner.
   * ## `"replace"`
   * 
   * Ask the current owner to stop and become the next to run.
   * ## `"drop-if-running"`
   * 
   * Reject the new submission; the owner and queue are unchanged.
   */
  export type Policy = 'queue' | 'replace' | 'drop-if-running';
  /**
   * A capability the plugin needs to do its job. The host refuses a
   * submission whose grants do not cover every declared capability, with a
   * message that names the missing grant.
   */
  export type Capability = CapabilityReadDir | CapabilityWriteDir | CapabilityEnv | CapabilityNetwork;
  /**
   * Read access to a preopened directory at this guest path
   * (granted with `--dir HOST::GUEST:ro` or `--dir HOST::GUEST`).
   */
  export interface CapabilityReadDir {
    tag: 'read-dir',
    val: string,
  }
  /**
   * Read and write access to a preopened directory at this guest path
   * (granted with `--dir HOST::GUEST`).
   */
  export interface CapabilityWriteDir {
    tag: 'write-dir',
    val: string,
  }
  /**
   * The named environment variable (granted with `--env NAME=VALUE`).
   */
  export interface CapabilityEnv {
    tag: 'env',
    val: string,
  }
  /**
   * Outbound HTTP through `wasi:http/outgoing-handler`, granted per host
   * with `--allow-http HOST[:PORT]` (`http://HOST[:PORT]` for plain
   * http); a submission without any `--allow-http` is refused. Every
   * request is checked against the grant; nothing else is reachable.
   */
  export interface CapabilityNetwork {
    tag: 'network',
  }
  /**
   * What a plugin says about itself. `describe` must answer quickly and
   * without side effects: the host calls it once per loaded component,
   * in an instance of its own, and refuses the component when the call
   * takes more than 2 seconds, needs more than 128 MiB of memory, traps,
   * or returns more than the limits given on each field.
   */
  export interface PluginInfo {
    /**
     * Short machine-friendly name, such as `deploy`: 1 to 128 ASCII
     * letters, digits, `-`, `_` or `.`. Task names default to
     * `<name>-<task id>`.
     */
    name: string,
    /**
     * The plugin's own version, free-form (semver recommended), at most
     * 128 bytes.
     */
    version: string,
    /**
     * One line for humans, at most 4096 bytes.
     */
    description: string,
    /**
     * The resource the plugin acts on, as a template with `{param}`
     * placeholders filled from the submission's params, such as
     * `deploy/{env}`, at most 512 bytes. Two tasks whose resources are
     * equal take turns. `none`: the task name is the slot.
     */
    resource?: string,
    /**
     * The admission policy used when the submission does not choose one.
     */
    defaultPolicy: Policy,
    /**
     * Everything the plugin needs granted to work: at most 64 entries,
     * each path or variable name at most 4096 bytes.
     */
    capabilities: Array<Capability>,
  }
  /**
   * Why an attempt failed.
   */
  export interface Failure {
    /**
     * A human-readable explanation.
     */
    reason: string,
    /**
     * An optional exit code, reported to the user and used as a hint by
     * scripts; the host's own exit code stays 1.
     */
    exitCode?: number,
  }
  /**
   * How `run` can fail.
   */
  export type TaskError = TaskErrorFail | TaskErrorFatal | TaskErrorCanceled;
  /**
   * A failure that may go away on retry (network blip, busy resource).
   * Retried under the `on-failure` and `always` restart policies.
   */
  export interface TaskErrorFail {
    tag: 'fail',
    val: Failure,
  }
  /**
   * A failure that retrying cannot fix (bad input, missing config).
   * Never retried.
   */
  export interface TaskErrorFatal {
    tag: 'fatal',
    val: Failure,
  }
  /**
   * The plugin stopped because the host asked it to (see
   * `host.is-cancelled`). Ends the task as canceled, not failed.
   * 
   * Spelling: this case is `canceled`, with one `l`, while
   * `sleep-status.cancelled` and `host.is-cancelled` have two. Bindings
   * keep the spelling of the case: `TaskError::Canceled` in Rust,
   * `TaskError_Canceled()` in Python, `{ tag: 'canceled' }` in
   * JavaScript. A JavaScript `throw { tag: 'cancelled' }` is not a
   * `task-error`: the instance traps and the attempt ends as a
   * retryable failure, not as canceled (the `task()` wrapper of
   * plugins/guests/js/taskhost.js accepts both spellings).
   */
  export interface TaskErrorCanceled {
    tag: 'canceled',
  }
  /**
   * Facts about the attempt being run.
   */
  export interface AttemptInfo {
    /**
     * The task's id, unique within one host process.
     */
    taskId: bigint,
    /**
     * The task's name.
     */
    name: string,
    /**
     * The admission slot the task owns while it runs.
     */
    slot: string,
    /**
     * 1 for the first attempt, 2 for the first retry, and so on.
     */
    attempt: number,
    /**
     * The submission's `--param K=V` pairs, in the order given.
     */
    params: Array<[string, string]>,
  }
  /**
   * How a host sleep ended.
   * # Variants
   * 
   * ## `"elapsed"`
   * 
   * The full duration elapsed.
   * ## `"cancelled"`
   * 
   * Cancellation arrived first; the sleep returned early.
   */
  export type SleepStatus = 'elapsed' | 'cancelled';
}

declare module 'taskhost:plugin/host@0.1.2' {
  /**
   * True once the host has asked this attempt to stop (cancel, remove,
   * replace, shutdown). A plugin should then return `canceled` soon; if it
   * does not within the host's grace period the instance is stopped by
   * force.
   */
  export function isCancelled(): boolean;
  /**
   * Sleeps for `ms` milliseconds, or less if cancellation arrives first.
   * Prefer this over the language's own sleep or a busy wait (Rust's
   * `std::thread::sleep`, Python's `time.sleep`, a loop on `Date.now()`
   * in JavaScript): it wakes immediately on cancel, and those do not.
   */
  export function sleep(ms: bigint): SleepStatus;
  /**
   * Writes one structured line to the task's log.
   */
  export function log(level: Level, message: string): void;
  /**
   * Reports progress: `done` units out of `total` (0 if unknown).
   */
  export function progress(done: bigint, total: bigint): void;
  /**
   * The facts of the current attempt, including its params.
   */
  export function attempt(): AttemptInfo;
  export type Level = import('taskhost:plugin/types@0.1.2').Level;
  export type AttemptInfo = import('taskhost:plugin/types@0.1.2').AttemptInfo;
  export type SleepStatus = import('taskhost:plugin/types@0.1.2').SleepStatus;
}

declare module 'taskhost:plugin/children@0.1.2' {
  /**
   * Starts a child (or finds the one its key started); returns its task
   * id, or why it cannot.
   */
  export function spawn(spec: ChildSpec): bigint;
  /**
   * Waits for a child's outcome; returns at once with `cancelled` when
   * this task is asked to stop.
   */
  export function wait(id: bigint): ChildOutcome;
  /**
   * A child to start.
   */
  export interface ChildSpec {
    /**
     * The child's key among its parent's children (letters, digits,
     * `-`, `_`, `.`; at most 128 bytes). A later attempt of the parent
     * (a retry, or after the daemon crashed) that spawns the same key
     * with the same spec gets the child the key first started, not a
     * new one.
     */
    key: string,
    /**
     * The plugin, by the digest (sha256, hex) of one the daemon stores,
     * or a deployment (`NAME`, `NAME@VERSION`, `NAME@sha256:HEX`),
     * resolved at the spawn; none: the parent's own plugin.
     */
    plugin?: string,
    /**
     * The child's name [default: `<parent name>.<key>`].
     */
    name?: string,
    /**
     * The child's slot [default: its plugin's resource, else its name].
     */
    slot?: string,
    /**
     * Params, in order.
     */
    params: Array<[string, string]>,
    /**
     * Input bytes.
     */
    input: Uint8Array,
  }
  /**
   * How a child ended.
   * # Variants
   * 
   * ## `"completed"`
   * 
   * ## `"failed"`
   * 
   * ## `"fatal"`
   * 
   * ## `"canceled"`
   * 
   * ## `"force-aborted"`
   * 
   * ## `"rejected"`
   * 
   * ## `"panicked"`
   */
  export type ChildStatus = 'completed' | 'failed' | 'fatal' | 'canceled' | 'force-aborted' | 'rejected' | 'panicked';
  /**
   * A child's outcome.
   */
  export interface ChildOutcome {
    status: ChildStatus,
    /**
     * Its output when it completed (else empty).
     */
    output: Uint8Array,
    /**
     * Why it did not complete (else empty).
     */
    reason: string,
  }
  /**
   * Why a wait gave no outcome.
   * # Variants
   * 
   * ## `"cancelled"`
   * 
   * This task was asked to stop while it waited.
   * ## `"unknown-child"`
   * 
   * The id is not a child this task started.
   */
  export type WaitError = 'cancelled' | 'unknown-child';
}

declare module 'taskhost:plugin/task-plugin@0.1.2' {
  export type PluginInfo = import('taskhost:plugin/types@0.1.2').PluginInfo;
  export type TaskError = import('taskhost:plugin/types@0.1.2').TaskError;
  export type * as TaskhostPluginChildren012 from 'taskhost:plugin/children@0.1.2'; // import taskhost:plugin/children@0.1.2
  export type * as TaskhostPluginHost012 from 'taskhost:plugin/host@0.1.2'; // import taskhost:plugin/host@0.1.2
  export type * as TaskhostPluginSlots012 from 'taskhost:plugin/slots@0.1.2'; // import taskhost:plugin/slots@0.1.2
  export type * as TaskhostPluginTypes012 from 'taskhost:plugin/types@0.1.2'; // import taskhost:plugin/types@0.1.2
  /**
  * Says what the plugin is, what it acts on and what it needs.
  */
  export function describe(): PluginInfo;
  /**
  * Runs one attempt. `input` is the submission's input bytes (empty if
  * none). On success the returned bytes are the task's output (at most
  * 16 MiB). A trap, such as an uncaught exception that the toolchain
  * turns into one, is a retryable failure (see the package comment).
  */
  export function run(input: Uint8Array): Uint8Array;
  export type Result<T, E> = { tag: 'ok', val: T } | { tag: 'err', val: E };
}

