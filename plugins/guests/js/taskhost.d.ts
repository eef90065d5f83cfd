// Types of taskhost.js and of the taskhost:plugin@0.1.0 world it wraps.
//
// TypeScript and editors pick this file up for `import ... from './taskhost.js'`.
// The raw world (`taskhost:plugin/host@0.1.0` and friends) is declared in
// world.d.ts, generated from wit/task-plugin.wit with `jco guest-types`.
/// <reference path="./world.d.ts" />

import type {
  AttemptInfo,
  Capability,
  CapabilityEnv,
  CapabilityNetwork,
  CapabilityReadDir,
  CapabilityWriteDir,
  Failure,
  Level,
  PluginInfo,
  Policy,
  SleepStatus,
  TaskError as WitTaskError,
  TaskErrorCanceled,
  TaskErrorFail,
  TaskErrorFatal,
} from 'taskhost:plugin/types@0.1.0';

export type {
  AttemptInfo,
  Capability,
  CapabilityEnv,
  CapabilityNetwork,
  CapabilityReadDir,
  CapabilityWriteDir,
  Failure,
  Level,
  PluginInfo,
  Policy,
  SleepStatus,
  WitTaskError,
  TaskErrorCanceled,
  TaskErrorFail,
  TaskErrorFatal,
};

// --- errors ----------------------------------------------------------------

/** Base of the errors that end `run` with a `task-error`; `payload` is the WIT value. */
export class TaskError extends Error {
  constructor(message: string, payload: WitTaskError);
  readonly payload: WitTaskError;
}
/** A failure that may go away on retry: the `fail` case. */
export class Fail extends TaskError {
  constructor(reason: string, exitCode?: number);
  readonly payload: TaskErrorFail;
}
/** A failure that retrying cannot fix: the `fatal` case. Never retried. */
export class Fatal extends TaskError {
  constructor(reason: string, exitCode?: number);
  readonly payload: TaskErrorFatal;
}
/** The task stopped because the host asked it to: the `canceled` case. */
export class Canceled extends TaskError {
  constructor(message?: string);
  readonly payload: TaskErrorCanceled;
}
/** The same as `Canceled` (the WIT uses both spellings). */
export const Cancelled: typeof Canceled;
export function fail(reason: string, exitCode?: number): Fail;
export function fatal(reason: string, exitCode?: number): Fatal;
export function canceled(): Canceled;
export function cancelled(): Canceled;

/** What a `task()` function may return: the output bytes. */
export type Output = Uint8Array | ArrayBuffer | ArrayBufferView | number[] | string | null | undefined;

/**
 * Wraps the function exported as `run`: converts its result to bytes and
 * whatever it throws to a `task-error` (anything that is not one becomes a
 * retryable `fail`).
 */
export function task(
  fn: (input: Uint8Array) => Output | Promise<Output>,
): (input: Uint8Array) => Uint8Array | Promise<Uint8Array>;

// --- describe --------------------------------------------------------------

export function readDir(guestPath: string): CapabilityReadDir;
export function writeDir(guestPath: string): CapabilityWriteDir;
export function env(name: string): CapabilityEnv;
export function network(): CapabilityNetwork;

/** Builds the `plugin-info` record that `describe` returns. */
export function info(opts: {
  name: string;
  version?: string;
  description?: string;
  /** Resource template such as `deploy/{env}`; omit for none (the task name is the slot). */
  resource?: string | null;
  /** Default `queue`. */
  policy?: Policy;
  capabilities?: Capability[];
}): PluginInfo;

// --- host calls ------------------------------------------------------------

export function attempt(): AttemptInfo;
export function params(): Record<string, string>;
export function param(name: string): string | undefined;
export function param<T>(name: string, fallback: T): string | T;
/** Throws `Fatal` (exit code 2) when the value is not an integer. */
export function paramInt(name: string, fallback: number): number;
export function isCancelled(): boolean;
export function checkCancelled(): void;
/** True when the whole duration elapsed, false when cancellation cut it short. */
export function sleep(ms: number): boolean;
export function progress(done: number, total?: number): void;

export interface Log {
  (level: Level, message: unknown): void;
  trace(message: unknown): void;
  debug(message: unknown): void;
  info(message: unknown): void;
  warn(message: unknown): void;
  error(message: unknown): void;
}
export const log: Log;
