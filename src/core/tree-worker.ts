/**
 * The steps of tree-writer.ts on a worker thread (docs/architecture.md, "Export and push"): an
 * export's host side parses and checks the archive on the main thread while this thread
 * makes the files, as the two processes of `tar | tar` overlap. The steps come in
 * batches, in order, with their file data in one transferred buffer; each batch is
 * acknowledged with its data's size (the main thread's bound on what is in flight), the
 * first failure is sent at once, and the last batch (`finishDirs`) is answered `done`.
 *
 * The main thread's side is WorkerSteps below; the worker runs this file's bottom half.
 */
import { existsSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { isMainThread, parentPort, Worker, workerData } from "node:worker_threads";
import { type DirMeta, type FileMeta, type Owner, TreeOps, type TreeSteps } from "./tree-ops.js";

type Step =
  | ["mkdir", string, string]
  | ["symlink", string, string, string, Owner | undefined]
  | ["open", string, string]
  | ["write", number]
  | ["close", FileMeta]
  | ["finishDirs", DirMeta[]];

interface Batch {
  steps: Step[];
  data: Uint8Array;
  /** What the batch counted for against IN_FLIGHT_BYTES: acknowledged as is. */
  cost: number;
}

type Answer = { ack: number } | { failure: string } | { done: true };

/** How many bytes of file data may be queued for the worker before the writer is told to wait. */
export const IN_FLIGHT_BYTES = 8 * 1024 * 1024;

/** A batch goes when it holds this much data (or at `flush`). */
const BATCH_BYTES = 256 * 1024;

/**
 * What a step without data counts for against IN_FLIGHT_BYTES, besides its path: an
 * archive of many empty files must not queue unbounded steps either.
 */
const STEP_COST = 256;

/** Marks the workers this file starts, so that importing it in another worker does nothing. */
const MARK = "pyro-tree-worker";

/**
 * The worker's script: this file as built (also when this code runs from src/ under a test
 * runner, or from the CLI's bundle, two levels below the package as dist/core/ is), or
 * null when there is no build.
 */
export function workerScript(): string | null {
  const file = join(fileURLToPath(new URL("../..", import.meta.url)), "dist", "core", "tree-worker.js");
  return existsSync(file) ? file : null;
}

/** TreeSteps that run on a worker thread; `flush` sends what is queued. */
export class WorkerSteps implements TreeSteps {
  private readonly worker: Worker;
  private steps: Step[] = [];
  private chunks: Uint8Array[] = [];
  private bytes = 0;
  /** What the queued steps count for (their data, STEP_COST and paths). */
  private cost = 0;
  private inFlight = 0;
  /** The thread ended (stopped, or died): nothing waits for it any more. */
  private dead = false;
  private waiting: (() => void)[] = [];
  private readonly finished: Promise<void>;
  private finish: () => void = () => {};

  constructor(script: string, onFailure: (problem: string) => void) {
    this.worker = new Worker(script, { workerData: MARK });
    this.finished = new Promise<void>((resolve) => {
      this.finish = resolve;
    });
    this.worker.on("message", (a: Answer) => {
      if ("ack" in a) {
        this.inFlight -= a.ack;
        if (this.inFlight < IN_FLIGHT_BYTES) this.release();
      } else if ("failure" in a) onFailure(a.failure);
      else this.finish();
    });
    // A thread that dies (its script failed to load, it ran out of memory) refuses the
    // archive and releases every wait: the caller's writes go on (to nothing), and `done`
    // settles, so the caller can remove the tree.
    const died = (why: string) => {
      if (this.dead) return;
      this.dead = true;
      onFailure(`the writer's thread ended (${why})`);
      this.release();
      this.finish();
    };
    this.worker.on("error", (err) => died(err.message));
    this.worker.on("exit", (code) => died(`exit ${code}`));
  }

  private release(): void {
    for (const w of this.waiting.splice(0)) w();
  }

  mkdir(at: string, name: string): void {
    this.queue(["mkdir", at, name], at.length);
  }

  symlink(target: string, at: string, name: string, owner?: Owner): void {
    this.queue(["symlink", target, at, name, owner], at.length + target.length);
  }

  open(at: string, name: string): void {
    this.queue(["open", at, name], at.length);
  }

  private queue(step: Step, chars: number): void {
    this.steps.push(step);
    this.cost += STEP_COST + 2 * chars;
  }

  write(data: Uint8Array): void {
    if (data.length === 0) return;
    this.steps.push(["write", data.length]);
    this.chunks.push(data);
    this.bytes += data.length;
    this.cost += data.length;
    if (this.bytes >= BATCH_BYTES) this.flush();
  }

  close(meta: FileMeta): void {
    this.queue(["close", meta], 0);
  }

  finishDirs(dirs: DirMeta[]): void {
    this.queue(
      ["finishDirs", dirs],
      dirs.reduce((n, d) => n + d.at.length, 0),
    );
    this.flush();
  }

  /** Sends the queued steps, their data copied into one buffer the worker then owns. */
  flush(): void {
    if (this.steps.length === 0) return;
    const data = new Uint8Array(this.bytes);
    let off = 0;
    for (const c of this.chunks) {
      data.set(c, off);
      off += c.length;
    }
    const batch: Batch = { steps: this.steps, data, cost: this.cost };
    if (!this.dead) {
      this.inFlight += this.cost;
      this.worker.postMessage(batch, [data.buffer]);
    }
    this.steps = [];
    this.chunks = [];
    this.bytes = 0;
    this.cost = 0;
  }

  /** Resolves once less than IN_FLIGHT_BYTES waits for the worker (null: there is room). */
  room(): Promise<void> | null {
    if (this.dead || this.inFlight < IN_FLIGHT_BYTES) return null;
    return new Promise((resolve) => this.waiting.push(resolve));
  }

  /**
   * Resolves when the worker has run `finishDirs`, or has died (its death refused the
   * archive); the thread is ended either way.
   */
  async done(): Promise<void> {
    try {
      await this.finished;
    } finally {
      await this.stop();
    }
  }

  /** Ends the thread (after which nothing more is written); safe more than once. */
  async stop(): Promise<void> {
    this.dead = true;
    this.release();
    this.finish();
    await this.worker.terminate();
  }
}

/**
 * Steps that start on this thread and move to a worker once the archive proves large (a
 * worker takes ~10-40 ms to start: a small export must not pay it). The move happens
 * between files, when none is open here, so every step still runs once and in order.
 */
export class SwitchingSteps implements TreeSteps {
  private readonly here: TreeOps;
  private worker: WorkerSteps | null = null;
  private bytes = 0;
  private files = 0;

  constructor(
    private readonly script: string,
    private readonly onFailure: (problem: string) => void,
    private readonly after = { bytes: 2 * 1024 * 1024, files: 256 },
  ) {
    this.here = new TreeOps(onFailure);
  }

  private get to(): TreeSteps {
    return this.worker ?? this.here;
  }

  mkdir(at: string, name: string): void {
    this.to.mkdir(at, name);
  }

  symlink(target: string, at: string, name: string, owner?: Owner): void {
    this.to.symlink(target, at, name, owner);
  }

  open(at: string, name: string): void {
    if (!this.worker && (this.bytes >= this.after.bytes || this.files >= this.after.files))
      this.worker = new WorkerSteps(this.script, this.onFailure);
    this.files++;
    this.to.open(at, name);
  }

  write(data: Uint8Array): void {
    this.bytes += data.length;
    this.to.write(data);
  }

  close(meta: FileMeta): void {
    this.to.close(meta);
  }

  finishDirs(dirs: DirMeta[]): void {
    this.to.finishDirs(dirs);
  }

  /** Whether the steps run on a worker now. */
  get onWorker(): boolean {
    return this.worker !== null;
  }

  flush(): void {
    this.worker?.flush();
  }

  room(): Promise<void> | null {
    return this.worker?.room() ?? null;
  }

  async done(): Promise<void> {
    await this.worker?.done();
  }

  async stop(): Promise<void> {
    await this.worker?.stop();
  }
}

/** The worker's side: runs each batch's steps in order. */
function serve(port: NonNullable<typeof parentPort>): void {
  const ops = new TreeOps((failure) => port.postMessage({ failure } satisfies Answer));
  port.on("message", (batch: Batch) => {
    let off = 0;
    for (const s of batch.steps) {
      if (s[0] === "mkdir") ops.mkdir(s[1], s[2]);
      else if (s[0] === "symlink") ops.symlink(s[1], s[2], s[3], s[4]);
      else if (s[0] === "open") ops.open(s[1], s[2]);
      else if (s[0] === "write") {
        ops.write(batch.data.subarray(off, off + s[1]));
        off += s[1];
      } else if (s[0] === "close") ops.close(s[1]);
      else {
        ops.finishDirs(s[1]);
        port.postMessage({ done: true } satisfies Answer);
      }
    }
    port.postMessage({ ack: batch.cost } satisfies Answer);
  });
}

if (!isMainThread && parentPort && workerData === MARK) serve(parentPort);
