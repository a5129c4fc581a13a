import type { Readable } from "node:stream";
import type { OutputListener } from "../core/output.js";
import type { Io } from "./output.js";

/**
 * How `workspace exec` and `run` connect a command to the terminal: its stdout and stderr
 * are written here as they are produced (not under --json, where stdout is one result
 * object), and the CLI's own stdin is its stdin when that is piped in (`echo x | pyro
 * workspace exec W -- cat`); a terminal's stdin is not passed.
 */
export interface LiveCommand {
  on_output?: OutputListener;
  stdin?: Readable;
  /** Stops reading stdin once the command is done, so the CLI can exit. */
  done(): void;
}

export function liveCommand(io: Io, json: boolean): LiveCommand {
  const stdin = io.stdin;
  return {
    ...(json
      ? {}
      : { on_output: (stream, chunk) => (stream === "stdout" ? io.stdout : io.stderr).write(chunk) }),
    ...(stdin ? { stdin } : {}),
    done: () => {
      stdin?.destroy();
    },
  };
}
